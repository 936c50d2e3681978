//! [`FleetBuilder`]: the one way to describe a fleet on this machine (its
//! servers, one of each or clusters; its workers and what they serve) and to
//! start it, with the orchestrator and the workers either as tasks of this
//! process ([`LocalFleet`]: `toolfleet dev`, the bench's default) or as
//! processes of their own ([`ProcessFleet`]: `toolfleet bench
//! --processes`, the tests).

use crate::local::{LocalFleet, LocalFleetOptions};
use crate::processes::ProcessFleet;
use crate::servers::{Nats, RedisClusterShape};
use crate::spec::{FleetSpec, Serving, owned};
use crate::supervisor::{RedisConfig, ServerOptions};

/// A fleet to start; see the module docs. Every setter is optional: the
/// default is one nats-server and one redis-server, one orchestrator and
/// two workers serving the built-in tools.
#[derive(Default)]
pub struct FleetBuilder {
    spec: FleetSpec,
}

impl FleetBuilder {
    /// The default fleet (see the type's docs).
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts `workers` workers with the fleet. Default: 2.
    #[must_use]
    pub fn workers(mut self, workers: usize) -> Self {
        self.spec.workers = workers;
        self
    }

    /// Starts `orchestrators` orchestrators with a fleet of processes (one
    /// always in-process). Default: 1.
    #[must_use]
    pub fn orchestrators(mut self, orchestrators: usize) -> Self {
        self.spec.orchestrators = orchestrators;
        self
    }

    /// What the workers serve. Default: the built-in tools.
    #[must_use]
    pub fn serving(mut self, serving: Serving) -> Self {
        self.spec.serving = serving;
        self
    }

    /// A NATS cluster of `nodes` nodes, every stream kept on each
    /// (`nats.replicas`); `None`: one server.
    #[must_use]
    pub fn nats_cluster(mut self, nodes: Option<usize>) -> Self {
        self.spec.servers.nats_nodes = nodes;
        self
    }

    /// What the one nats-server's configuration file adds (accounts, users).
    #[must_use]
    pub fn nats_config(mut self, config: Option<String>) -> Self {
        self.spec.servers.nats_config = config;
        self
    }

    /// Runs on `nats`, a server the caller started and configured itself,
    /// instead of starting one.
    #[must_use]
    pub fn on_nats(mut self, nats: Nats) -> Self {
        self.spec.nats = Some(nats);
        self
    }

    /// A Redis Cluster of this shape (`redis.cluster`); `None`: one server.
    #[must_use]
    pub fn redis_cluster(mut self, shape: Option<RedisClusterShape>) -> Self {
        self.spec.servers.redis_cluster = shape;
        self
    }

    /// Every redis-server's configuration (an append-only file, a user).
    #[must_use]
    pub fn redis(mut self, config: RedisConfig) -> Self {
        self.spec.servers.redis = config;
        self
    }

    /// JetStream and Redis fsync every write before acknowledging it.
    #[must_use]
    pub fn fsync_always(mut self, always: bool) -> Self {
        self.spec.servers.fsync_always = always;
        self
    }

    /// NATS and Redis speak TLS only, with certificates made for the fleet
    /// (in-process fleets only).
    #[must_use]
    pub fn tls(mut self, tls: bool) -> Self {
        self.spec.tls = tls;
        self
    }

    /// Where the servers' dirs go, their process group, their logs; a fleet
    /// of processes starts its services with the same options.
    #[must_use]
    pub fn server_options(mut self, options: ServerOptions) -> Self {
        self.spec.servers.options = options;
        self
    }

    /// Environment of every service process.
    #[must_use]
    pub fn env(mut self, env: &[(&str, &str)]) -> Self {
        self.spec.env.extend(owned(env));
        self
    }

    /// Environment of every worker process, on top of [`env`](Self::env).
    #[must_use]
    pub fn worker_env(mut self, env: &[(&str, &str)]) -> Self {
        self.spec.worker_env.extend(owned(env));
        self
    }

    /// Environment of every orchestrator process, on top of
    /// [`env`](Self::env).
    #[must_use]
    pub fn orchestrator_env(mut self, env: &[(&str, &str)]) -> Self {
        self.spec.orchestrator_env.extend(owned(env));
        self
    }

    /// Starts the fleet with its orchestrator and workers as processes;
    /// see [`ProcessFleet`].
    ///
    /// # Errors
    ///
    /// A server or service did not start; the error names which.
    pub async fn start_processes(self) -> anyhow::Result<ProcessFleet> {
        ProcessFleet::start(self.spec).await
    }

    /// Starts the fleet with its orchestrator and workers in this process;
    /// see [`LocalFleet`].
    ///
    /// # Errors
    ///
    /// The description asks for what only a fleet of processes has
    /// (clusters, environment variables), a binary is missing or too old,
    /// a server or component did not come up in time, or the gRPC port is
    /// taken. Whatever had started is stopped again.
    pub async fn start_in_process(self, options: LocalFleetOptions) -> anyhow::Result<LocalFleet> {
        LocalFleet::start(self.spec, options).await
    }
}
