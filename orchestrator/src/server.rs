//! Assembles an orchestrator replica: connections, registry, runner and the
//! gRPC server, and runs them until shutdown.
//!
//! Shutdown stages, on the `shutdown` token:
//! 1. stop accepting gRPC requests and stop pulling jobs;
//! 2. let running jobs go on for `runner.drain_timeout`;
//! 3. hand the rest back (lease released, message nak'ed) so another replica
//!    resumes them;
//! 4. flush NATS and return.

use std::sync::Arc;

use async_nats::jetstream;
use redis::aio::ConnectionManager;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolfleet_proto::names::RedisKeys;
use toolfleet_proto::v1::agent_service_server::AgentServiceServer;
use toolfleet_service::connect::{self, ConnectError, patiently};
use toolfleet_service::telemetry::Readiness;
use tracing::{info, warn};

use crate::config::OrchestratorOptions;
use crate::dispatch::Dispatcher;
use crate::grpc::AgentApi;
use crate::model::Providers;
use crate::registry::Registry;
use crate::runner::{self, Runner};
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
    /// The reflection service rejected the built-in descriptors: a bug.
    #[error("cannot build the gRPC reflection service")]
    Reflection(#[source] tonic_reflection::server::Error),
}

/// A connected orchestrator replica.
pub struct Orchestrator {
    options: OrchestratorOptions,
    nats: async_nats::Client,
    redis: ConnectionManager,
    readiness: Readiness,
}

impl Orchestrator {
    /// Connects to NATS and Redis.
    ///
    /// # Errors
    ///
    /// [`StartError::Connect`].
    pub async fn connect(options: OrchestratorOptions) -> Result<Self, StartError> {
        let nats = connect::nats(&options.nats, "toolfleet-orchestrator").await?;
        let redis = connect::redis(&options.redis).await?;
        Ok(Self {
            options,
            nats,
            redis,
            readiness: Readiness::default(),
        })
    }

    /// Reports through `readiness` (the `/readyz` endpoint): ready once the
    /// replica serves gRPC, not ready again once it drains.
    #[must_use]
    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// Serves gRPC on `listener` and runs jobs until `shutdown`, then drains
    /// (see the module docs for the stages).
    ///
    /// # Errors
    ///
    /// JetStream setup or the gRPC server failed.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), StartError> {
        let js = jetstream::new(self.nats.clone());
        // Waited for while JetStream is unavailable; a shutdown ends the wait.
        let parts = tokio::select! {
            parts = self.assemble(&js) => parts,
            () = shutdown.cancelled() => return Ok(()),
        };
        let tasks = TaskTracker::new();
        // What this future spawns stops with it, also when a caller drops it
        // before the drain (the runner then drains and hands its jobs back).
        let background = CancellationToken::new();
        let _stop_background = background.clone().drop_guard();
        let shutdown = shutdown.child_token();
        let _stop_runner = shutdown.clone().drop_guard();
        tasks.spawn(parts.registry.run(background.clone()));
        let runner = self.options.runner.clone();
        tasks.spawn(runner::sweep::run(
            parts.api.store.clone(),
            js,
            runner.sweep_interval,
            runner.sweep_after,
            background.clone(),
        ));
        let runner_task = tasks.spawn({
            let (runner, shutdown) = (parts.runner, shutdown.clone());
            async move { runner.run(shutdown).await }
        });
        tasks.close();
        self.readiness.set(true);
        let served = serve_grpc(listener, parts.api, &parts.instance, &shutdown).await;
        self.readiness.set(false);
        info!("grpc server stopped; draining jobs");
        let _ = runner_task.await;
        background.cancel();
        tasks.wait().await;
        if let Err(err) = self.nats.flush().await {
            warn!(error = %err, "could not flush NATS at shutdown");
        }
        info!("orchestrator stopped");
        served
    }

    /// The replica's components, wired together but not yet running.
    async fn assemble(&self, js: &jetstream::Context) -> Parts {
        let options = &self.options;
        patiently("the job stream", || runner::ensure_job_stream(js)).await;
        let ttl = options.registry.ttl;
        let bucket = patiently("the registry bucket", || connect::registry_bucket(js, ttl)).await;
        let store = JobStore::new(
            self.redis.clone(),
            self.nats.clone(),
            RedisKeys::new(options.redis.key_prefix.clone()),
            options.store.job_retention,
            options.store.idempotency_ttl,
        );
        let registry = Registry::new(bucket, options.registry.ttl);
        let providers = Arc::new(Providers::new(options.openai.clone()));
        let dispatcher = Dispatcher {
            nats: self.nats.clone(),
            js: js.clone(),
            store: store.clone(),
            registry: registry.handle(),
            options: options.dispatch.clone(),
        };
        let instance = options.resolved_instance_id();
        let runner = Runner {
            js: js.clone(),
            store: store.clone(),
            dispatcher,
            providers: providers.clone(),
            options: options.runner.clone(),
            owner: instance.clone(),
        };
        let api = AgentApi {
            store,
            js: js.clone(),
            registry: registry.handle(),
            providers,
            options: options.api.clone(),
        };
        Parts {
            registry,
            runner,
            api,
            instance,
        }
    }
}

/// What [`Orchestrator::assemble`] builds.
struct Parts {
    registry: Registry,
    runner: Runner,
    api: AgentApi,
    instance: String,
}

/// Serves the API, health and reflection on `listener` until `shutdown`.
async fn serve_grpc(
    listener: TcpListener,
    api: AgentApi,
    instance: &str,
    shutdown: &CancellationToken,
) -> Result<(), StartError> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<AgentServiceServer<AgentApi>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(toolfleet_proto::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(StartError::Reflection)?;
    let address = listener
        .local_addr()
        .map_or_else(|_| "unknown".to_owned(), |a| a.to_string());
    info!(instance = %instance, grpc = %address, "orchestrator ready");
    // Without TCP_NODELAY, small responses wait for delayed ACKs (~40 ms).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection)
        .add_service(AgentServiceServer::new(api))
        .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned())
        .await
        .map_err(StartError::Grpc)
}
