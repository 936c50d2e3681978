//! Assembles an orchestrator replica: gRPC server, connections, registry and
//! runner, and runs them until shutdown.
//!
//! Start-up: the gRPC server listens at once, with health `NOT_SERVING` and
//! every API call answered `UNAVAILABLE`, while the replica waits for NATS,
//! Redis and its JetStream set-up; then health turns `SERVING`, the API
//! answers, and the replica pulls jobs (decision 0007).
//!
//! Shutdown stages, on the `shutdown` token, each bounded so that the drain
//! ends within `runner.drain_timeout` and the margin of
//! `toolfleet_service::drain` whatever NATS and Redis do:
//! 1. stop accepting gRPC requests, end open watches with `UNAVAILABLE` (the
//!    client watches again elsewhere) and stop pulling jobs;
//! 2. let running jobs and API calls go on until the drain's deadline,
//!    `runner.drain_timeout` after the signal;
//! 3. hand the remaining jobs back (lease released, message nak'ed) so
//!    another replica resumes them, and close what API calls remain;
//! 4. stop the registry watch, the backlog poll and the sweeper, flush NATS
//!    and return.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::ServerTlsConfig;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use toolfleet_proto::names::RedisKeys;
use toolfleet_proto::v1::agent_service_server::AgentServiceServer;
use toolfleet_service::connect::{self, ConnectError, OwnMessages, RedisClient, patiently};
use toolfleet_service::drain;
use toolfleet_service::queue::{self, Missing, WorkQueue};
use toolfleet_service::telemetry::Readiness;
use tracing::{info, warn};

use crate::api::{AgentApi, StartingApi};
use crate::auth::{AuthError, Authenticated, Authenticator};
use crate::config::OrchestratorOptions;
use crate::dispatch::Dispatcher;
use crate::live::Live;
use crate::model::Providers;
use crate::quota::{Quotas, TenantLimits};
use crate::registry::Registry;
use crate::runner::{self, Runner};
use crate::spans::ToolContent;
use crate::store::JobStore;

/// Why an orchestrator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The NATS or Redis configuration cannot work (an invalid URL, an
    /// unreadable credentials file): check `nats.*` and `redis.*`. An
    /// unreachable server is waited for, not an error.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The gRPC server failed.
    #[error("gRPC server failed")]
    Grpc(#[source] tonic::transport::Error),
    /// The API's authentication is not set up: fix `api.auth` or
    /// `api.tokens_file` as the message says.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// `grpc.tls.*` is incomplete, or a file cannot be read or used.
    #[error("grpc.tls: {0}")]
    Tls(String),
    /// The reflection service rejected the built-in descriptors: a bug.
    #[error("cannot build the gRPC reflection service")]
    Reflection(#[source] tonic_reflection::server::Error),
}

/// An orchestrator replica.
pub struct Orchestrator {
    options: OrchestratorOptions,
    readiness: Readiness,
}

impl Orchestrator {
    /// A replica with `options`; nothing connects before [`run`](Self::run).
    pub fn new(options: OrchestratorOptions) -> Self {
        Self {
            options,
            readiness: Readiness::default(),
        }
    }

    /// Reports through `readiness` (the `/readyz` endpoint): ready once the
    /// replica serves, not ready again once it drains.
    #[must_use]
    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// Serves gRPC on `listener` at once, waits for NATS, Redis and JetStream,
    /// then runs jobs until `shutdown`, and drains (see the module docs).
    ///
    /// # Errors
    ///
    /// A configuration that cannot work, or the gRPC server failed.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), StartError> {
        // What this future starts stops with it, also when a caller drops it
        // before the drain (the runner then drains and hands its jobs back).
        let shutdown = shutdown.child_token();
        let _stop_all = shutdown.clone().drop_guard();
        let address = listener
            .local_addr()
            .map_or_else(|_| "unknown".to_owned(), |a| a.to_string());
        // Before anything listens: a replica that cannot tell callers
        // apart must not serve at all.
        let api_options = &self.options.api;
        let defaults = Quotas::from_defaults(
            api_options.default_max_active_jobs,
            api_options.default_submissions_per_second,
            api_options.default_max_calls_in_flight,
        );
        let auth = Authenticator::start(
            api_options.auth,
            api_options.tokens_file.as_deref(),
            &api_options.identity,
            api_options.tokens_reload_interval,
            defaults,
        )?;
        let tls = self
            .options
            .grpc
            .tls
            .server_config()
            .map_err(StartError::Tls)?;
        let (health, health_service) = tonic_health::server::health_reporter();
        // Both the API and the server as a whole ("", what a kubelet gRPC
        // probe asks by default) are not serving until the replica is ready.
        health
            .set_not_serving::<AgentServiceServer<StartingApi>>()
            .await;
        health
            .set_service_status("", ServingStatus::NotServing)
            .await;
        let api = StartingApi::default();
        info!(grpc = %address, "grpc listening; not serving until ready");
        let server = tokio::spawn(serve_grpc(
            listener,
            api.clone(),
            auth,
            tls,
            health_service,
            self.options.grpc.clone(),
            shutdown.clone(),
        ));
        let started = tokio::select! {
            started = self.start(&api, &shutdown) => Some(started),
            // A signal while waiting for the servers: nothing to drain.
            () = shutdown.cancelled() => None,
        };
        let running = match started {
            Some(Ok(running)) => running,
            Some(Err(err)) => {
                shutdown.cancel();
                let _ = server.await;
                return Err(err);
            }
            None => return server.await.unwrap_or(Ok(())),
        };
        health
            .set_serving::<AgentServiceServer<StartingApi>>()
            .await;
        health.set_service_status("", ServingStatus::Serving).await;
        self.readiness.set(true);
        info!(instance = %running.instance, grpc = %address, "orchestrator ready");
        self.drain(server, &shutdown, running).await
    }

    /// Drains the replica once `shutdown` is cancelled, or once `server`
    /// ended on its own (it failed): the API and the runner together.
    async fn drain(
        &self,
        mut server: tokio::task::JoinHandle<Result<(), StartError>>,
        shutdown: &CancellationToken,
        running: Running,
    ) -> Result<(), StartError> {
        let failed = tokio::select! {
            biased;
            () = shutdown.cancelled() => None,
            served = &mut server => Some(served.unwrap_or(Ok(()))),
        };
        shutdown.cancel();
        self.readiness.set(false);
        let deadline = drain::deadline(shutdown, self.options.runner.drain_timeout).await;
        info!("draining: the API ends its calls and watches, the runner its jobs");
        let api_stopped = async {
            match failed {
                Some(served) => served,
                None => api_stopped_by(server, deadline).await,
            }
        };
        let (served, ()) = tokio::join!(api_stopped, running.stop(deadline));
        info!("orchestrator stopped");
        served
    }

    /// Connects, assembles the replica, makes `api` answer and starts the
    /// registry watch, the sweeper and the runner.
    async fn start(
        &self,
        api: &StartingApi,
        stopping: &CancellationToken,
    ) -> Result<Running, StartError> {
        let connected = self.connect().await?;
        let providers = Arc::new(Providers::new(
            self.options.openai.clone(),
            self.options.anthropic.clone(),
        ));
        api.serve(self.agent_api(&connected, providers.clone(), stopping));
        let instance = self.options.resolved_instance_id();
        let runner = self.runner(&connected, providers, &instance);
        Ok(self.spawn(connected, runner, instance))
    }

    /// The API of this replica, on its connections.
    fn agent_api(
        &self,
        connected: &Connected,
        providers: Arc<Providers>,
        stopping: &CancellationToken,
    ) -> AgentApi {
        let store = &connected.store;
        AgentApi {
            store: store.clone(),
            live: connected.live.clone(),
            js: connected.js.clone(),
            registry: connected.registry.handle(),
            providers,
            limits: TenantLimits::new(store.clone()),
            options: self.options.api.clone(),
            breaker: self.options.breaker.clone(),
            stopping: stopping.clone(),
        }
    }

    /// The runner of this replica, known in leases as `instance`, with the
    /// dispatcher of its jobs' calls.
    fn runner(&self, connected: &Connected, providers: Arc<Providers>, instance: &str) -> Runner {
        let options = &self.options;
        let Connected {
            nats,
            js,
            store,
            live,
            registry,
            missing,
        } = connected;
        let dispatcher = Dispatcher {
            nats: nats.clone(),
            js: js.clone(),
            store: store.clone(),
            registry: registry.handle(),
            limits: TenantLimits::new(store.clone()),
            options: options.dispatch.clone(),
            approval: options.approval.clone(),
            tool_content: ToolContent::from_setting(options.telemetry.capture_tool_content),
            results: options.results.clone(),
            breaker: options.breaker.clone(),
        };
        Runner {
            js: js.clone(),
            store: store.clone(),
            live: live.clone(),
            dispatcher,
            providers,
            options: options.runner.clone(),
            owner: instance.to_owned(),
            missing: *missing,
        }
    }

    /// Starts the registry watch, the gauges, the sweeper and `runner`,
    /// each stopped by the drain of the [`Running`] it returns.
    fn spawn(&self, connected: Connected, runner: Runner, instance: String) -> Running {
        let Connected {
            nats,
            js,
            store,
            registry,
            ..
        } = connected;
        let tasks = TaskTracker::new();
        let background = CancellationToken::new();
        let jobs = CancellationToken::new();
        crate::metrics::register();
        tasks.spawn(crate::backlog::run(
            js.clone(),
            registry.handle(),
            background.clone(),
        ));
        tasks.spawn(crate::backlog::run_approvals(
            store.clone(),
            background.clone(),
        ));
        if self.options.breaker.enabled {
            tasks.spawn(crate::backlog::run_breakers(
                store.clone(),
                registry.handle(),
                background.clone(),
            ));
        }
        tasks.spawn(registry.run(background.clone()));
        let sweep = &self.options.runner;
        tasks.spawn(runner::sweep::run(
            store,
            js,
            sweep.sweep_interval,
            sweep.sweep_after,
            background.clone(),
        ));
        let runner = tasks.spawn(runner.run(jobs.clone()));
        tasks.close();
        Running {
            instance,
            nats,
            tasks,
            runner,
            jobs: jobs.drop_guard(),
            background: background.drop_guard(),
        }
    }

    /// Connects to NATS and Redis, and waits for the job stream and the
    /// registry bucket: `SubmitJob` publishes to the one, the runner reads
    /// the tools from the other.
    async fn connect(&self) -> Result<Connected, StartError> {
        let options = &self.options;
        let redis = RedisClient::new(&options.redis)?;
        // Its only plain publishes are its jobs' wake-ups, which it hands
        // to its own watchers directly (`live`): NATS's copy back
        // to it was about seven messages out per job, each read for nothing.
        let nats = connect::nats(
            &options.nats,
            "toolfleet-orchestrator",
            OwnMessages::Skipped,
        )
        .await?;
        let redis = redis.connect().await;
        let js = connect::jetstream(nats.clone(), &options.nats);
        let missing = Missing::from_options(&options.nats);
        let job_queue = WorkQueue::jobs();
        patiently("the job stream", || job_queue.open(&js, missing)).await;
        let ttl = options.registry.ttl;
        let bucket = patiently("the registry bucket", || queue::registry(&js, ttl, missing)).await;
        let live = Live::new(nats.clone());
        let store = JobStore::new(
            redis,
            live.clone(),
            RedisKeys::new(options.redis.key_prefix.clone()),
            options.store.job_retention,
            options.store.idempotency_ttl,
        );
        let registry = Registry::new(bucket, ttl, store.clone());
        Ok(Connected {
            nats,
            js,
            store,
            live,
            registry,
            missing,
        })
    }
}

/// A replica's connections and what it found on them.
struct Connected {
    nats: async_nats::Client,
    js: async_nats::jetstream::Context,
    store: JobStore,
    live: Live,
    registry: Registry,
    /// What to do about a JetStream object that is missing.
    missing: Missing,
}

/// Waits for the gRPC server's graceful end (its calls answered; watches
/// end at the shutdown) until `deadline`, then drops it with what it still
/// serves: a call hung on an outage must not hold the drain.
async fn api_stopped_by(
    mut server: tokio::task::JoinHandle<Result<(), StartError>>,
    deadline: Instant,
) -> Result<(), StartError> {
    match tokio::time::timeout_at(deadline, &mut server).await {
        Ok(served) => served.unwrap_or(Ok(())),
        Err(_) => {
            warn!("API calls still open at the drain deadline; closing their connections");
            server.abort();
            Ok(())
        }
    }
}

/// The parts of a started replica that its drain stops. Dropped without a
/// drain (a caller dropped [`Orchestrator::run`]), its guards stop them all.
struct Running {
    instance: String,
    nats: async_nats::Client,
    tasks: TaskTracker,
    runner: tokio::task::JoinHandle<()>,
    /// Stops pulling jobs; the runner then drains.
    jobs: tokio_util::sync::DropGuard,
    /// Stops the registry watch and the sweeper.
    background: tokio_util::sync::DropGuard,
}

impl Running {
    /// Drains the runner by `deadline`, then stops the rest and flushes
    /// NATS, each within its bound (`toolfleet_service::drain`).
    async fn stop(self, deadline: Instant) {
        drop(self.jobs);
        // The runner hands back what it still runs by the deadline and the
        // hand-back bound; this bound is the backstop.
        let until = (deadline + drain::HAND_BACK).saturating_duration_since(Instant::now());
        let what = "draining the runner (jobs not handed back resume when their lease expires)";
        drain::bounded(what, until, self.runner).await;
        drop(self.background);
        // What they wait on is only ever a read (the registry, the backlog)
        // or the sweeper's re-queue, which the next sweep does again.
        let what = "stopping the background tasks";
        drain::bounded(what, drain::LAST_STEP, self.tasks.wait()).await;
        drain::flush(&self.nats).await;
    }
}

/// Serves the API, health and (with `grpc.reflection`) reflection on `listener`
/// until `shutdown`.
async fn serve_grpc<H: Health>(
    listener: TcpListener,
    api: StartingApi,
    auth: Authenticator,
    tls: Option<ServerTlsConfig>,
    health: HealthServer<H>,
    options: crate::config::GrpcOptions,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    // Reflection only where asked (grpc.reflection): it lists the whole API
    // to anyone. Both versions: grpcurl speaks v1, while Python's
    // grpcio-reflection and other older clients speak only v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(toolfleet_proto::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let (reflection_v1, reflection_v1alpha) = if options.reflection {
        (
            Some(reflection().build_v1().map_err(StartError::Reflection)?),
            Some(
                reflection()
                    .build_v1alpha()
                    .map_err(StartError::Reflection)?,
            ),
        )
    } else {
        (None, None)
    };
    // Without TCP_NODELAY, small responses wait for delayed ACKs (~40 ms).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).map_err(StartError::Grpc)?;
    }
    builder
        .add_service(health)
        .add_optional_service(reflection_v1)
        .add_optional_service(reflection_v1alpha)
        // Health and reflection are not authenticated; every API call is.
        .add_service(Authenticated::new(
            AgentServiceServer::new(api).max_decoding_message_size(options.max_request_bytes),
            auth,
        ))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
        .map_err(StartError::Grpc)
}
