//! The worker runtime: connects to NATS and Redis, sets up the call stream and
//! one durable pull consumer per tool (shared by every replica: that is the
//! horizontal scaling), announces the tools, and executes calls until told to
//! stop.
//!
//! Shutdown stages, on the `shutdown` token (SIGTERM or SIGINT in the binary):
//! 1. stop intake: withdraw the announcements, stop pulling, nak calls that
//!    arrive on a still-open pull request;
//! 2. let in-flight calls finish, up to `runtime.drain_timeout` after the
//!    signal;
//! 3. abandon the rest: release their claims and nak them, so JetStream
//!    redelivers them to another worker at once;
//! 4. flush the NATS connection so no ack is lost, and return.
//!
//! Each stage is bounded (`toolfleet_service::drain`): with NATS or Redis
//! gone or hung, what a stage could not finish is left to be taken over as
//! after a crash, and the drain still ends in time.

mod execute;
mod pull;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolfleet_proto::names::RedisKeys;
use toolfleet_service::connect::RedisConnection;
use toolfleet_service::connect::{self, ConnectError, OwnMessages, RedisClient, patiently};
use toolfleet_service::drain;
use toolfleet_service::queue::{self, Missing, SharedConsumer, WorkQueue};
use toolfleet_service::telemetry::Readiness;
use tracing::{info, warn};

pub use crate::tool_set::SchemaError;
use crate::tool_set::{ToolSet, Unservable};

use crate::config::{RuntimeOptions, WorkerOptions};
use crate::ledger::Ledger;
use crate::registry::Announcer;
use crate::tool::Toolbox;
use execute::Executor;
use pull::PullLoop;

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The NATS or Redis configuration cannot work (an invalid URL, an
    /// unreadable credentials file): check `nats.*` and `redis.*`. An
    /// unreachable server is waited for, not an error.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The toolbox is empty, so there is nothing to serve: check `tools`.
    #[error("no tools to serve")]
    NoTools,
    /// A tool's name is not `^[a-zA-Z0-9_-]{1,64}$`.
    #[error("invalid tool name {0:?}: use 1 to 64 letters, digits, '_' or '-'")]
    ToolName(String),
    /// A tool's schema does not compile.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// A tool's manifest, as configured, would be ignored by the
    /// orchestrators (a cache TTL on a tool that is not `read_only`, say).
    #[error(transparent)]
    Manifest(Unservable),
}

impl From<Unservable> for StartError {
    fn from(why: Unservable) -> Self {
        match why {
            Unservable::Name(name) => Self::ToolName(name),
            Unservable::Schema(err) => Self::Schema(err),
            manifest @ Unservable::Manifest { .. } => Self::Manifest(manifest),
        }
    }
}

/// A connected worker, ready to serve a toolbox.
pub struct Worker {
    options: WorkerOptions,
    worker_id: String,
    nats: async_nats::Client,
    redis: RedisConnection,
    readiness: Readiness,
    tools: ToolSet,
}

impl Worker {
    /// Connects to NATS and Redis.
    ///
    /// # Errors
    ///
    /// [`StartError::Connect`] when a server is unreachable.
    pub async fn connect(options: WorkerOptions) -> Result<Self, StartError> {
        let worker_id = options.resolved_worker_id();
        let name = format!("toolfleet-worker {worker_id}");
        let redis = RedisClient::new(&options.redis)?;
        let nats = connect::nats(&options.nats, &name, OwnMessages::Delivered).await?;
        let redis = redis.connect().await;
        let runtime = options.runtime.clone();
        let tools = ToolSet::new(move |manifest| runtime.configured(manifest));
        Ok(Self {
            options,
            worker_id,
            nats,
            redis,
            readiness: Readiness::default(),
            tools,
        })
    }

    /// Reports through `readiness` (the `/readyz` endpoint): ready once the
    /// worker serves its tools, not ready again once it drains.
    #[must_use]
    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// This process's id in the registry and in claims.
    pub fn id(&self) -> &str {
        &self.worker_id
    }

    /// The Redis connection, for tools that need one.
    pub fn redis(&self) -> RedisConnection {
        self.redis.clone()
    }

    /// The tools it serves, where a source that changes its tools while
    /// the worker runs (an MCP server) declares them before [`run`](Self::run),
    /// then offers them and takes them down.
    pub fn tools(&self) -> ToolSet {
        self.tools.clone()
    }

    /// Serves `toolbox`, and the tools declared in [`tools`](Self::tools),
    /// until `shutdown` is cancelled, then drains (see the module docs for
    /// the stages).
    ///
    /// # Errors
    ///
    /// A [`StartError`] if the toolbox or JetStream setup is invalid; once
    /// serving, failures are logged and retried, not returned.
    pub async fn run(
        self,
        toolbox: Toolbox,
        shutdown: CancellationToken,
    ) -> Result<(), StartError> {
        let runtime = &self.options.runtime;
        self.tools.insert_all(toolbox.into_tools())?;
        let tool_names = self.tools.names();
        if tool_names.is_empty() {
            return Err(StartError::NoTools);
        }
        // Waited for while JetStream is unavailable; a shutdown ends the wait.
        let (consumers, registry) = tokio::select! {
            set_up = self.set_up_jetstream(&tool_names) => set_up,
            () = shutdown.cancelled() => return Ok(()),
        };
        let announcer = Announcer {
            js: registry,
            nats: self.nats.clone(),
            worker_id: self.worker_id.clone(),
            pool: self.options.pool.clone(),
            tools: self.tools.clone(),
            options: self.options.registry.clone(),
        };
        let ack_wait = shortest_ack_wait(&consumers, runtime.ack_wait);
        let executor = Arc::new(self.executor(ack_wait));
        // Should this future be dropped before it drains (a caller's select or
        // abort), nothing it started outlives it: intake stops, and running
        // calls are abandoned and handed back as after a drain timeout.
        let stop_intake = shutdown.child_token();
        let _stop_intake = stop_intake.clone().drop_guard();
        let _abandon_calls = executor.abandon.clone().drop_guard();
        let calls = TaskTracker::new();
        let intake = start_intake(consumers, announcer, &executor, &calls, &stop_intake);
        info!(worker_id = %self.worker_id, tools = ?tool_names,
              max_in_flight = runtime.max_in_flight.get(), "worker ready");
        self.readiness.set(true);

        shutdown.cancelled().await;
        self.drain(intake, calls, &executor).await;
        Ok(())
    }

    /// One durable consumer per tool, and where to announce the tools. A
    /// consumer that existed keeps its own AckWait, so that is the one the
    /// calls are kept alive against. With `nats.create_missing` the call
    /// stream and the registry bucket are created if need be; without it,
    /// only the consumers are opened (the setup step makes the bucket
    /// before any consumer).
    async fn set_up_jetstream(
        &self,
        tools: &[String],
    ) -> (Vec<(String, consumer::PullConsumer)>, jetstream::Context) {
        let js = connect::jetstream(self.nats.clone(), &self.options.nats);
        let runtime = &self.options.runtime;
        let missing = Missing::from_options(&self.options.nats);
        let calls = WorkQueue::calls(runtime.call_max_age);
        let mut consumers = Vec::new();
        for name in tools {
            let what = format!("the consumer of {name}");
            let shared = SharedConsumer::tool(name, runtime.ack_wait);
            let consumer = patiently(&what, || shared.open_in(&js, &calls, missing)).await;
            consumers.push((name.clone(), consumer));
        }
        if let Missing::Create { .. } = missing {
            let ttl = self.options.registry.ttl;
            patiently("the registry bucket", || queue::registry(&js, ttl, missing)).await;
        }
        (consumers, js)
    }

    /// The executor of the worker's tools, keeping calls alive against `ack_wait`.
    fn executor(&self, ack_wait: Duration) -> Executor {
        let runtime = &self.options.runtime;
        let keys = RedisKeys::new(self.options.redis.key_prefix.clone());
        let ledger = Ledger::new(
            self.redis.clone(),
            keys,
            runtime.claim_lease,
            runtime.result_retention,
        );
        Executor {
            tools: self.tools.clone(),
            ledger,
            nats: self.nats.clone(),
            options: RuntimeOptions {
                ack_wait,
                ..runtime.clone()
            },
            worker_id: self.worker_id.clone(),
            abandon: CancellationToken::new(),
        }
    }

    /// Stages 1 to 4 of the shutdown, once `shutdown` is cancelled (see the
    /// module docs), each bounded so that the drain ends within
    /// `runtime.drain_timeout` and the margin of `toolfleet_service::drain`.
    async fn drain(&self, intake: TaskTracker, calls: TaskTracker, executor: &Executor) {
        let deadline = tokio::time::Instant::now() + self.options.runtime.drain_timeout;
        self.readiness.set(false);
        info!(in_flight = calls.len(), "draining");
        calls.close();
        // Intake stops (its last pull request read, the announcements
        // withdrawn) while the calls go on.
        let stopped = async { tokio::join!(intake.wait(), calls.wait()) };
        if tokio::time::timeout_at(deadline, stopped).await.is_err() {
            warn!(
                abandoned = calls.len(),
                "drain timeout; handing the remaining calls back"
            );
            executor.abandon.cancel();
            let handed_back = async { tokio::join!(intake.wait(), calls.wait()) };
            let what = "handing the calls back (they are redelivered after AckWait)";
            drain::bounded(what, drain::HAND_BACK, handed_back).await;
        }
        drain::flush(&self.nats).await;
        info!("worker stopped");
    }
}

impl Toolbox {
    /// What [`Worker::run`] checks of the toolbox before it serves: at
    /// least one tool, valid names, schemas that compile. For a binary to
    /// check before it connects.
    ///
    /// # Errors
    ///
    /// The first tool that cannot be served, and why.
    pub fn check(&self) -> Result<(), StartError> {
        if self.manifests().is_empty() {
            return Err(StartError::NoTools);
        }
        let tools = ToolSet::new(|manifest| manifest);
        Ok(tools.insert_all(self.clone().into_tools())?)
    }
}

/// Starts one pull loop per tool, each spawning its calls into `calls`, and
/// the announcer; all of them stop on `shutdown`. Returns their tracker,
/// already closed.
fn start_intake(
    consumers: Vec<(String, consumer::PullConsumer)>,
    announcer: Announcer,
    executor: &Arc<Executor>,
    calls: &TaskTracker,
    shutdown: &CancellationToken,
) -> TaskTracker {
    let options = &executor.options;
    // One pool of slots for every tool: a tool takes them as its calls arrive.
    let slots = Arc::new(Semaphore::new(options.max_in_flight.get()));
    crate::metrics::max_in_flight(options.max_in_flight.get());
    for (tool, _) in &consumers {
        crate::metrics::register_tool(tool);
    }
    let keep_alive = options.ack_wait / 3;
    let intake = TaskTracker::new();
    for (tool, consumer) in consumers {
        let pull = PullLoop {
            tool,
            consumer,
            executor: executor.clone(),
            slots: slots.clone(),
            keep_alive,
            tasks: calls.clone(),
        };
        intake.spawn(pull.run(shutdown.clone()));
    }
    intake.spawn(announcer.run(shutdown.clone()));
    intake.close();
    intake
}

/// The shortest AckWait of `consumers`: calls are kept alive against it.
/// A consumer that existed keeps its own AckWait (set by `toolfleet-orchestrator
/// setup` or by the first worker that created it), which may not be
/// `configured` (`runtime.ack_wait`); that is logged.
fn shortest_ack_wait(
    consumers: &[(String, consumer::PullConsumer)],
    configured: Duration,
) -> Duration {
    let mut shortest = configured;
    for (tool, consumer) in consumers {
        let actual = consumer.cached_info().config.ack_wait;
        if actual != configured {
            warn!(tool, consumer_ack_wait = ?actual, runtime_ack_wait = ?configured,
                  "the tool's consumer has its own AckWait; calls are kept alive against it");
        }
        if !actual.is_zero() {
            shortest = shortest.min(actual);
        }
    }
    shortest
}
