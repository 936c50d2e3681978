//! A local fleet for tests: one NATS, one Redis and worker processes, plus the
//! client-side helpers to publish calls and read their results.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;
use futures::StreamExt;
use toolfleet_proto::envelope::StoredResult;
use toolfleet_proto::job::JobId;
use toolfleet_proto::names::{self, RedisKeys};
use toolfleet_proto::{Envelope, ToolCall};

use toolfleet_proto::v1;

pub use toolfleet_fleet::servers::{Nats, Redis};
use toolfleet_fleet::servers::{RedisClusterShape, ServersSpec};

use crate::{ChildProcess, RedisConfig, RedisServer, cargo_bin};

/// A gRPC client of the AgentService.
pub type ApiClient = v1::agent_service_client::AgentServiceClient<tonic::transport::Channel>;

/// How long a worker gets to connect and set up its consumers.
const WORKER_READY: Duration = Duration::from_secs(30);

/// NATS, Redis and `toolfleet-worker` processes with the test tools enabled.
pub struct Fleet {
    /// The fleet's NATS.
    pub nats: Nats,
    /// The fleet's Redis.
    pub redis: Redis,
    /// A client connected to `nats`.
    pub client: async_nats::Client,
    workers: Vec<ChildProcess>,
    /// Environment of every service, worker or orchestrator (`nats.replicas`
    /// on a cluster).
    service_env: Vec<(String, String)>,
    worker_env: Vec<(String, String)>,
    orchestrators: Vec<ChildProcess>,
}

impl Fleet {
    /// Starts NATS, Redis and `workers` worker processes.
    ///
    /// # Errors
    ///
    /// A server or worker did not start; the error names which.
    pub async fn start(workers: usize) -> anyhow::Result<Self> {
        Self::start_with(workers, &[]).await
    }

    /// Like [`start`](Self::start), with extra environment for every worker
    /// (e.g. `TOOLFLEET_RUNTIME__CLAIM_LEASE=1s`).
    ///
    /// # Errors
    ///
    /// A server or worker did not start; the error names which.
    pub async fn start_with(workers: usize, worker_env: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::start_with_redis(workers, worker_env, RedisConfig::default()).await
    }

    /// Like [`start_with`](Self::start_with), with a Redis configuration (AOF
    /// on, for tests that restart Redis).
    ///
    /// # Errors
    ///
    /// A server or worker did not start; the error names which.
    pub async fn start_with_redis(
        workers: usize,
        worker_env: &[(&str, &str)],
        redis: RedisConfig,
    ) -> anyhow::Result<Self> {
        let spec = ServersSpec {
            redis,
            ..ServersSpec::default()
        };
        let (nats, redis) = spec.start().await?;
        let client = nats.client().await?;
        let mut fleet = Self::start_with_servers(nats, client, redis, worker_env);
        for _ in 0..workers {
            fleet.spawn_worker().await?;
        }
        Ok(fleet)
    }

    /// Like [`start_with_redis`](Self::start_with_redis), on clusters: a
    /// NATS cluster of 3 nodes where every service keeps 3 copies of each
    /// stream (`nats.replicas`), and a Redis Cluster of 3 primaries with a
    /// replica each, every node configured by `redis` (`redis.cluster`); a
    /// write counts once a replica holds it (`redis.wait_replicas = 1`).
    ///
    /// # Errors
    ///
    /// A server or worker did not start; the error names which.
    pub async fn start_on_clusters(
        workers: usize,
        worker_env: &[(&str, &str)],
        redis: RedisConfig,
    ) -> anyhow::Result<Self> {
        Self::start_on_clusters_with_replicas(workers, worker_env, redis, 1).await
    }

    /// Like [`start_on_clusters`](Self::start_on_clusters), with `replicas`
    /// replicas of each Redis primary.
    ///
    /// # Errors
    ///
    /// A server or worker did not start; the error names which.
    pub async fn start_on_clusters_with_replicas(
        workers: usize,
        worker_env: &[(&str, &str)],
        redis: RedisConfig,
        replicas: usize,
    ) -> anyhow::Result<Self> {
        let spec = ServersSpec {
            nats_nodes: Some(3),
            redis_cluster: Some(RedisClusterShape {
                primaries: 3,
                replicas,
            }),
            redis,
            ..ServersSpec::default()
        };
        // The services wait for a replica after each write: the spec waits
        // until every replica has its first copy.
        let (nats, redis) = spec.start().await?;
        let client = nats.client().await?;
        let mut fleet = Self::start_with_servers(nats, client, redis, worker_env);
        fleet.service_env = vec![
            ("TOOLFLEET_NATS__REPLICAS".to_owned(), "3".to_owned()),
            ("TOOLFLEET_REDIS__CLUSTER".to_owned(), "true".to_owned()),
            // As deploy.md asks of a cluster: a write counts once a
            // replica holds it too.
            ("TOOLFLEET_REDIS__WAIT_REPLICAS".to_owned(), "1".to_owned()),
        ];
        for _ in 0..workers {
            fleet.spawn_worker().await?;
        }
        Ok(fleet)
    }

    /// A fleet on a NATS server the test configured itself (authentication,
    /// TLS, permissions): `client` is the harness's own connection to it,
    /// and `worker_env` carries the workers' NATS settings.
    ///
    /// # Errors
    ///
    /// Redis or a worker did not start; the error names which.
    pub async fn start_on(
        nats: Nats,
        client: async_nats::Client,
        redis: RedisConfig,
        workers: usize,
        worker_env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let redis = RedisServer::start_with(redis).await?;
        let mut fleet =
            Self::start_with_servers(nats, client, Redis::Server(redis.into()), worker_env);
        for _ in 0..workers {
            fleet.spawn_worker().await?;
        }
        Ok(fleet)
    }

    fn start_with_servers(
        nats: Nats,
        client: async_nats::Client,
        redis: Redis,
        worker_env: &[(&str, &str)],
    ) -> Self {
        Self {
            nats,
            redis,
            client,
            workers: Vec::new(),
            service_env: Vec::new(),
            orchestrators: Vec::new(),
            worker_env: worker_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    /// Starts one more worker and waits until it serves; returns its index.
    ///
    /// # Errors
    ///
    /// The binary is missing or the worker did not become ready.
    pub async fn spawn_worker(&mut self) -> anyhow::Result<usize> {
        self.spawn_worker_with(&[]).await
    }

    /// Like [`spawn_worker`](Self::spawn_worker), with `env` on top of the
    /// fleet's worker environment for this one worker.
    ///
    /// # Errors
    ///
    /// The binary is missing or the worker did not become ready.
    pub async fn spawn_worker_with(&mut self, env: &[(&str, &str)]) -> anyhow::Result<usize> {
        let index = self.start_worker_with(&["--test-tools"], env)?;
        self.workers[index]
            .wait_for_log("worker ready", WORKER_READY)
            .await
            .with_context(|| format!("worker-{index} did not become ready"))?;
        Ok(index)
    }

    /// Starts one more worker without waiting for it to serve (it may be
    /// waiting for a server that is down); returns its index.
    ///
    /// # Errors
    ///
    /// The binary is missing or cannot be started.
    pub fn start_worker(&mut self) -> anyhow::Result<usize> {
        self.start_worker_with(&["--test-tools"], &[])
    }

    /// Starts one worker of a pool: it serves only `tools` (no test tools),
    /// with `env` on top of the fleet's worker environment (its NATS user,
    /// say). Does not wait for it to serve; returns its index.
    ///
    /// # Errors
    ///
    /// The binary is missing or cannot be started.
    pub fn start_pool_worker(
        &mut self,
        tools: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<usize> {
        self.start_worker_with(&["--tools", &tools.join(",")], env)
    }

    fn start_worker_with(
        &mut self,
        serving: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<usize> {
        let index = self.workers.len();
        let id = format!("worker-{index}");
        let mut args = vec![
            "--nats-url".to_owned(),
            self.nats.url(),
            "--redis-url".to_owned(),
            self.redis.url(),
            "--worker-id".to_owned(),
            id.clone(),
        ];
        args.extend(serving.iter().map(|arg| (*arg).to_owned()));
        let mut all_env = vec![(
            "RUST_LOG".to_owned(),
            "info,toolfleet_worker=debug".to_owned(),
        )];
        all_env.extend(self.service_env.iter().cloned());
        all_env.extend(self.worker_env.iter().cloned());
        all_env.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let worker = ChildProcess::spawn(&id, cargo_bin("toolfleet-worker")?, args, all_env)?;
        self.workers.push(worker);
        Ok(index)
    }

    /// Starts a `toolfleet-orchestrator` process on a free port and waits until
    /// it serves; returns its index. `env` adds configuration.
    ///
    /// # Errors
    ///
    /// The binary is missing or the orchestrator did not become ready.
    pub async fn spawn_orchestrator(&mut self, env: &[(&str, &str)]) -> anyhow::Result<usize> {
        let index = self.start_orchestrator(env)?;
        grpc_address(&self.orchestrators[index]).await?;
        Ok(index)
    }

    /// Starts a `toolfleet-orchestrator` process without waiting for it to
    /// serve (it may be waiting for a server that is down); returns its
    /// index. [`api`](Self::api) waits for it.
    ///
    /// # Errors
    ///
    /// The binary is missing or cannot be started.
    pub fn start_orchestrator(&mut self, env: &[(&str, &str)]) -> anyhow::Result<usize> {
        let index = self.orchestrators.len();
        let id = format!("orchestrator-{index}");
        let args = [
            "--nats-url".to_owned(),
            self.nats.url(),
            "--redis-url".to_owned(),
            self.redis.url(),
            "--listen".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--instance-id".to_owned(),
            id.clone(),
        ];
        let mut all_env = vec![
            (
                "RUST_LOG".to_owned(),
                "info,toolfleet_orchestrator=debug".to_owned(),
            ),
            // The tests' jobs are scripted, and only the security tests
            // authenticate; a test that needs otherwise says so.
            (
                "TOOLFLEET_API__ALLOW_SCRIPTED".to_owned(),
                "true".to_owned(),
            ),
            ("TOOLFLEET_API__AUTH".to_owned(), "none".to_owned()),
        ];
        all_env.extend(self.service_env.iter().cloned());
        all_env.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let process =
            ChildProcess::spawn(&id, cargo_bin("toolfleet-orchestrator")?, args, all_env)?;
        self.orchestrators.push(process);
        Ok(index)
    }

    /// All orchestrator processes started so far.
    pub fn orchestrators(&self) -> impl Iterator<Item = &ChildProcess> {
        self.orchestrators.iter()
    }

    /// The `index`th orchestrator process.
    pub fn orchestrator(&self, index: usize) -> &ChildProcess {
        &self.orchestrators[index]
    }

    /// A gRPC client of the `index`th orchestrator (of its current run: a
    /// respawned orchestrator listens on a new port).
    ///
    /// # Errors
    ///
    /// The orchestrator does not accept the connection.
    pub async fn api(&self, index: usize) -> anyhow::Result<ApiClient> {
        let address = self.grpc_url(index).await?;
        Ok(ApiClient::connect(address).await?)
    }

    /// The gRPC URL of the `index`th orchestrator (of its current run), for
    /// clients other than [`api`](Self::api): the CLI, the Python client.
    ///
    /// # Errors
    ///
    /// It never logged its address.
    pub async fn grpc_url(&self, index: usize) -> anyhow::Result<String> {
        grpc_address(&self.orchestrators[index]).await
    }

    /// Waits until the registry, as the `index`th orchestrator sees it, lists
    /// `tools` each served by at least `workers` workers.
    ///
    /// # Errors
    ///
    /// Not within the deadline.
    pub async fn wait_for_tools(
        &self,
        index: usize,
        tools: &[&str],
        workers: u32,
    ) -> anyhow::Result<()> {
        let mut api = self.api(index).await?;
        crate::wait_until("the tools to be live", WORKER_READY, || {
            let mut api = api.clone();
            async move {
                let Ok(live) = api.list_tools(v1::ListToolsRequest {}).await else {
                    return false;
                };
                let live = live.into_inner().tools;
                tools
                    .iter()
                    .all(|t| live.iter().any(|l| l.name == *t && l.workers >= workers))
            }
        })
        .await?;
        api.list_tools(v1::ListToolsRequest {}).await?;
        Ok(())
    }

    /// The `index`th worker started.
    pub fn worker(&self, index: usize) -> &ChildProcess {
        &self.workers[index]
    }

    /// All workers started so far.
    pub fn workers(&self) -> &[ChildProcess] {
        &self.workers
    }

    /// How often `needle` occurs in the logs of every worker, over all their
    /// runs (a respawn appends to its log).
    pub fn count_in_worker_logs(&self, needle: &str) -> usize {
        self.workers
            .iter()
            .map(|w| w.log_tail(1_000_000).matches(needle).count())
            .sum()
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

/// The gRPC URL an orchestrator process logged when it became ready (in its
/// current run), waiting for it if need be.
async fn grpc_address(process: &ChildProcess) -> anyhow::Result<String> {
    let line = process
        .wait_for_log("orchestrator ready", WORKER_READY)
        .await
        .with_context(|| format!("{} did not become ready", process.name()))?;
    toolfleet_fleet::supervisor::logged_grpc_url(&line)
        .with_context(|| format!("no gRPC address in {line:?}"))
}

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
