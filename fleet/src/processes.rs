//! A fleet whose orchestrators and workers are processes of their own, as a
//! deployment runs them: `toolfleet bench --processes` (which pays what a
//! deployment pays) and the tests (which kill, freeze and restart them).
//! Started by
//! [`FleetBuilder::start_processes`](crate::FleetBuilder::start_processes).
//!
//! Each service is the workspace's binary ([`cargo_bin`]), configured as in
//! production: by flags and `TOOLFLEET_*` variables. Every orchestrator
//! listens on a free loopback port and, on loopback for one user, takes
//! scripted jobs from anyone; a caller that wants otherwise sets the
//! variables. On clusters the services keep every stream on each NATS node
//! (`nats.replicas`) and speak Redis Cluster (`redis.cluster`).

use std::time::Duration;

use anyhow::Context as _;
use toolfleet_proto::v1;

use crate::servers::{Nats, Redis};
use crate::spec::{Env, FleetSpec, Serving, owned};
use crate::supervisor::{ChildProcess, ServerOptions, cargo_bin, logged_grpc_url};

/// A gRPC client of the AgentService.
pub type ApiClient = v1::agent_service_client::AgentServiceClient<tonic::transport::Channel>;

/// How long a service gets to connect, set up and say it is ready.
const READY: Duration = Duration::from_secs(60);

/// What every orchestrator of a local fleet runs with unless told
/// otherwise: the jobs of the bench and the tests are scripted, and the
/// fleet is on loopback for one user.
const ORCHESTRATOR_DEFAULTS: [(&str, &str); 2] = [
    ("TOOLFLEET_API__ALLOW_SCRIPTED", "true"),
    ("TOOLFLEET_API__AUTH", "none"),
];

/// How the fleet's services are started.
struct Launch {
    serving: Serving,
    /// Every service's environment: the servers' shape, then the builder's.
    env: Env,
    worker_env: Env,
    orchestrator_env: Env,
    options: ServerOptions,
}

/// A running fleet of processes. Dropping it kills every service, then the
/// servers.
pub struct ProcessFleet {
    // Declared before the servers, so that they are killed first.
    workers: Vec<ChildProcess>,
    orchestrators: Vec<ChildProcess>,
    /// The fleet's NATS.
    pub nats: Nats,
    /// The fleet's Redis.
    pub redis: Redis,
    launch: Launch,
}

impl ProcessFleet {
    /// Starts the servers `spec` describes (or uses its NATS), then its
    /// orchestrators and workers, and returns once every one of them says
    /// it is ready.
    ///
    /// # Errors
    ///
    /// A server or service did not start (the error names which), or the
    /// description asks for TLS, which only an in-process fleet has.
    pub(crate) async fn start(spec: FleetSpec) -> anyhow::Result<Self> {
        let FleetSpec {
            servers,
            nats,
            tls,
            workers,
            orchestrators,
            serving,
            env,
            worker_env,
            orchestrator_env,
        } = spec;
        anyhow::ensure!(
            !tls,
            "a fleet over TLS runs in this process only (FleetBuilder::start_in_process)"
        );
        let (nats, redis) = match nats {
            Some(nats) => (nats, servers.start_redis().await?),
            None => servers.start().await?,
        };
        let mut service_env = shape_env(&nats, &redis);
        service_env.extend(env);
        let mut fleet = Self {
            workers: Vec::new(),
            orchestrators: Vec::new(),
            nats,
            redis,
            launch: Launch {
                serving,
                env: service_env,
                worker_env,
                orchestrator_env,
                options: servers.options,
            },
        };
        // All at once, then each waited for.
        for _ in 0..orchestrators {
            fleet.start_orchestrator(&[])?;
        }
        for _ in 0..workers {
            fleet.start_worker()?;
        }
        for index in 0..workers {
            fleet.worker_ready(index).await?;
        }
        for index in 0..orchestrators {
            fleet.grpc_url(index).await?;
        }
        Ok(fleet)
    }

    /// Starts one more worker serving what the fleet's workers serve and
    /// waits until it serves; returns its index.
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
        let serving = self.launch.serving.clone();
        let index = self.launch_worker(&serving, env)?;
        self.worker_ready(index).await?;
        Ok(index)
    }

    /// Starts one more worker without waiting for it to serve (it may be
    /// waiting for a server that is down); returns its index.
    ///
    /// # Errors
    ///
    /// The binary is missing or cannot be started.
    pub fn start_worker(&mut self) -> anyhow::Result<usize> {
        let serving = self.launch.serving.clone();
        self.launch_worker(&serving, &[])
    }

    /// Starts one worker of a pool: it serves only `tools`, with `env` on
    /// top of the fleet's worker environment (its NATS user, say). Does not
    /// wait for it to serve; returns its index.
    ///
    /// # Errors
    ///
    /// The binary is missing or cannot be started.
    pub fn start_pool_worker(
        &mut self,
        tools: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<usize> {
        let tools = tools.iter().map(|tool| (*tool).to_owned()).collect();
        self.launch_worker(&Serving::Tools(tools), env)
    }

    /// Worker `worker-<index>`: the fleet's servers, what it serves, and
    /// the environment of every service, of every worker, then `env`.
    fn launch_worker(&mut self, serving: &Serving, env: &[(&str, &str)]) -> anyhow::Result<usize> {
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
        match serving {
            Serving::BuiltIn => {}
            Serving::TestTools => args.push("--test-tools".to_owned()),
            Serving::Tools(tools) => args.extend(["--tools".to_owned(), tools.join(",")]),
        }
        let launch = &self.launch;
        let all_env = (launch.env.iter().cloned())
            .chain(launch.worker_env.iter().cloned())
            .chain(owned(env));
        let worker = ChildProcess::spawn_with(
            &id,
            cargo_bin("toolfleet-worker")?,
            args,
            all_env,
            &launch.options,
        )?;
        self.workers.push(worker);
        Ok(index)
    }

    /// Waits until worker `index` (in its current run) says it serves.
    async fn worker_ready(&self, index: usize) -> anyhow::Result<()> {
        self.workers[index]
            .wait_for_log("worker ready", READY)
            .await
            .with_context(|| format!("worker-{index} did not become ready"))?;
        Ok(())
    }

    /// Starts a `toolfleet-orchestrator` process on a free port and waits
    /// until it serves; returns its index. `env` adds configuration.
    ///
    /// # Errors
    ///
    /// The binary is missing or the orchestrator did not become ready.
    pub async fn spawn_orchestrator(&mut self, env: &[(&str, &str)]) -> anyhow::Result<usize> {
        let index = self.start_orchestrator(env)?;
        self.grpc_url(index).await?;
        Ok(index)
    }

    /// Starts `orchestrator-<index>` without waiting for it to serve (it
    /// may be waiting for a server that is down); returns its index.
    /// [`grpc_url`](Self::grpc_url) waits for it.
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
        let launch = &self.launch;
        let all_env = owned(&ORCHESTRATOR_DEFAULTS)
            .chain(launch.env.iter().cloned())
            .chain(launch.orchestrator_env.iter().cloned())
            .chain(owned(env));
        let process = ChildProcess::spawn_with(
            &id,
            cargo_bin("toolfleet-orchestrator")?,
            args,
            all_env,
            &launch.options,
        )?;
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

    /// The gRPC URL of the `index`th orchestrator (of its current run: a
    /// respawned orchestrator listens on a new port), once it has logged it.
    ///
    /// # Errors
    ///
    /// It did not become ready in time, or never logged its address.
    pub async fn grpc_url(&self, index: usize) -> anyhow::Result<String> {
        let process = &self.orchestrators[index];
        let line = process
            .wait_for_log("orchestrator ready", READY)
            .await
            .with_context(|| format!("{} did not become ready", process.name()))?;
        logged_grpc_url(&line).with_context(|| format!("no gRPC address in {line:?}"))
    }

    /// A gRPC client of the `index`th orchestrator (of its current run).
    ///
    /// # Errors
    ///
    /// The orchestrator does not accept the connection.
    pub async fn api(&self, index: usize) -> anyhow::Result<ApiClient> {
        let address = self.grpc_url(index).await?;
        ApiClient::connect(address.clone())
            .await
            .with_context(|| format!("cannot reach the orchestrator at {address}"))
    }

    /// Waits until the registry, as the `index`th orchestrator sees it,
    /// lists `tools` each served by at least `workers` workers.
    ///
    /// # Errors
    ///
    /// Not within the deadline, or the orchestrator exited.
    pub async fn wait_for_tools(
        &self,
        index: usize,
        tools: &[&str],
        workers: u32,
    ) -> anyhow::Result<()> {
        self.wait_for_tools_as(index, None, tools, workers).await
    }

    /// [`wait_for_tools`](Self::wait_for_tools), asking with `token` as
    /// the bearer token, for an orchestrator that takes tokens
    /// (`api.auth = tokens`).
    ///
    /// # Errors
    ///
    /// Not within the deadline, or the orchestrator exited.
    pub async fn wait_for_tools_as(
        &self,
        index: usize,
        token: Option<&str>,
        tools: &[&str],
        workers: u32,
    ) -> anyhow::Result<()> {
        let api = self.api(index).await?;
        let bearer: Option<tonic::metadata::AsciiMetadataValue> = match token {
            Some(token) => Some(format!("Bearer {token}").parse()?),
            None => None,
        };
        let what = format!("{} on {workers} workers", tools.join(", "));
        self.orchestrators[index]
            .wait_until(&what, READY, || {
                let mut api = api.clone();
                let mut request = tonic::Request::new(v1::ListToolsRequest::default());
                if let Some(bearer) = &bearer {
                    request
                        .metadata_mut()
                        .insert("authorization", bearer.clone());
                }
                async move {
                    let live = api.list_tools(request).await.ok()?;
                    let live = live.into_inner().tools;
                    tools
                        .iter()
                        .all(|t| live.iter().any(|l| l.name == *t && l.workers >= workers))
                        .then_some(())
                }
            })
            .await
    }
}

/// What every service needs to know of the servers' shape: a NATS cluster
/// keeps each stream on every node, and a Redis Cluster is spoken to as one.
fn shape_env(nats: &Nats, redis: &Redis) -> Env {
    let mut env = Env::new();
    if let Nats::Cluster(_) = nats {
        let nodes = nats.named().len().to_string();
        env.push(("TOOLFLEET_NATS__REPLICAS".to_owned(), nodes));
    }
    if let Redis::Cluster(_) = redis {
        env.push(("TOOLFLEET_REDIS__CLUSTER".to_owned(), "true".to_owned()));
    }
    env
}
