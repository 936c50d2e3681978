//! A whole toolfleet in this process, for `toolfleet dev` and `toolfleet
//! bench`; started by
//! [`FleetBuilder::start_in_process`](crate::FleetBuilder::start_in_process).
//!
//! It runs `nats-server` (JetStream) and `redis-server` as
//! child processes on free loopback ports with the [`supervisor`], each with
//! its data and log in a dir of its own inside the fleet's temp dir, then one
//! orchestrator and N workers as tasks of this process, and returns once every
//! worker's tools are listed by the orchestrator's `ListTools`. Every wait is a
//! probe with a deadline, never a fixed sleep.
//!
//! The machine's own NATS (4222) and Redis (6379) are never used.
//!
//! Stopping, in [`LocalFleet::shutdown`]: cancel the orchestrator and the
//! workers and wait for them to drain (bounded), then kill the servers and
//! remove the temp dir. Dropping a fleet (a panic, an early return) does the
//! last two at once. The servers run in their own process group, so a Ctrl-C
//! at the terminal reaches only this process, which stops the fleet in order;
//! for the second Ctrl-C, which exits without destructors, hand
//! [`LocalFleet::kill_switch`] (or the one in [`LocalFleetOptions`]) to
//! `toolfleet_cli::watch_signals_then`.
//!
//! The [`KillSwitch`] lives in `kill_switch.rs`, the fleet's tracing output
//! (`fleet.log`) in `fleet_log.rs`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use toolfleet_proto::v1;
use toolfleet_proto::v1::agent_service_client::AgentServiceClient;
use toolfleet_worker::{Worker, WorkerOptions, tools};

use crate::servers::{Nats, Redis, ServersSpec};
use crate::spec::{FleetSpec, Serving};
use crate::supervisor::certificates::Certificates;
use crate::supervisor::{self, NatsServer, RedisServer, RedisTls, ServerOptions};
use toolfleet_orchestrator::{Orchestrator, OrchestratorOptions};

mod fleet_log;
mod kill_switch;

use fleet_log::FleetLog;
pub use kill_switch::KillSwitch;

/// A gRPC client of the fleet's orchestrator, on loopback.
type ApiClient = AgentServiceClient<tonic::transport::Channel>;

/// How to run a [`LocalFleet`], beyond what its
/// [`FleetBuilder`](crate::FleetBuilder) says
/// (the servers, the workers and what they serve).
#[derive(Debug, Clone)]
pub struct LocalFleetOptions {
    /// gRPC port of the orchestrator on 127.0.0.1; 0 picks a free one.
    /// Default: 0.
    pub grpc_port: u16,
    /// Print a line to stderr per start-up and shutdown step. Default: true.
    pub progress: bool,
    /// Send the orchestrator's and workers' logs to `fleet.log` in the temp dir
    /// (`RUST_LOG` sets the level; default `info`). This installs the global
    /// tracing subscriber unless one is installed already. Default: true.
    pub log_to_file: bool,
    /// Keep the temp dir (logs, data) after shutdown. Default: false.
    pub keep_dir: bool,
    /// How long each start-up step may take. Default: 30s.
    pub start_timeout: Duration,
    /// The orchestrator's options; the fleet sets `nats.url`, `redis.url`,
    /// `grpc.listen` and `instance_id`. Default: the orchestrator's defaults
    /// with a 5s `runner.drain_timeout`.
    pub orchestrator: OrchestratorOptions,
    /// Every worker's options; the fleet sets `worker_id`, `nats.url`,
    /// `redis.url`, and `tools` and `test_tools` as the builder serves. Default: the worker's defaults with a 5s
    /// `runtime.drain_timeout`.
    pub worker: WorkerOptions,
    /// Registered with the servers and the temp dir as soon as they exist, so
    /// that a second Ctrl-C during start-up can clean up too. Default: a new one.
    pub kill_switch: KillSwitch,
}

impl Default for LocalFleetOptions {
    fn default() -> Self {
        let mut orchestrator = OrchestratorOptions::default();
        orchestrator.runner.drain_timeout = Duration::from_secs(5);
        // A local fleet is for demos and benchmarks: the scripted model and
        // reflection (for grpcurl) are on, authentication off.
        orchestrator.api.allow_scripted = true;
        orchestrator.grpc.reflection = true;
        // On loopback only, for one user: no tokens (dev says so).
        orchestrator.api.auth = toolfleet_orchestrator::auth::AuthMode::None;
        let mut worker = WorkerOptions::default();
        worker.runtime.drain_timeout = Duration::from_secs(5);
        Self {
            grpc_port: 0,
            progress: true,
            log_to_file: true,
            keep_dir: false,
            start_timeout: Duration::from_secs(30),
            orchestrator,
            worker,
            kill_switch: KillSwitch::default(),
        }
    }
}

/// A running local fleet; see the module docs.
///
/// Dropping it cancels the orchestrator and the workers without waiting, kills
/// the servers and removes the temp dir; [`shutdown`](Self::shutdown) stops
/// them in order.
pub struct LocalFleet {
    grpc_addr: SocketAddr,
    progress: Progress,
    /// How long the services may take to drain: the longer of their drain
    /// times, and the margin within which each drain ends.
    drain_bound: Duration,
    keep_dir: bool,
    kill_switch: KillSwitch,
    shutdown: CancellationToken,
    tasks: Vec<(String, JoinHandle<anyhow::Result<()>>)>,
    // Drop order: the tasks are told to stop, then the servers are killed,
    // then the dir goes.
    _stop_tasks: DropGuard,
    nats: NatsServer,
    redis: RedisServer,
    /// The certificates NATS and Redis serve with, if they speak TLS.
    tls: Option<Certificates>,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for LocalFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalFleet")
            .field("grpc_addr", &self.grpc_addr)
            .field("nats_url", &self.nats.url())
            .field("redis_url", &self.redis.url())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

/// What an in-process fleet takes of its description: its servers
/// and its workers. The rest (a NATS of the caller's, clusters, several
/// orchestrators, environment variables) only a fleet of processes has.
struct InProcess {
    servers: ServersSpec,
    tls: bool,
    workers: usize,
    serving: Serving,
}

impl InProcess {
    fn of(spec: FleetSpec) -> anyhow::Result<Self> {
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
        if workers == 0 {
            bail!("a local fleet needs at least one worker");
        }
        if nats.is_some() || servers.nats_nodes.is_some() || servers.redis_cluster.is_some() {
            bail!("an in-process fleet runs on a nats-server and a redis-server of its own");
        }
        if orchestrators != 1 || !(env.is_empty() && worker_env.is_empty()) {
            bail!(
                "an in-process fleet runs one orchestrator, and its services take \
                 LocalFleetOptions, not environment variables"
            );
        }
        anyhow::ensure!(
            orchestrator_env.is_empty(),
            "an in-process orchestrator takes LocalFleetOptions, not environment variables"
        );
        Ok(Self {
            servers,
            tls,
            workers,
            serving,
        })
    }
}

/// The fleet's nats-server and redis-server, as `spec` says, with `options`:
/// over TLS when the fleet has certificates; each registered with the kill
/// switch.
async fn start_servers(
    spec: ServersSpec,
    options: ServerOptions,
    tls: Option<&Certificates>,
    kill_switch: &KillSwitch,
    progress: Progress,
) -> anyhow::Result<(NatsServer, RedisServer)> {
    progress.start("starting nats-server and redis-server");
    let mut spec = ServersSpec { options, ..spec };
    if let Some(certificates) = tls {
        let config = spec.nats_config.get_or_insert_default();
        config.push_str(&format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n",
            certificates.path("server.pem"),
            certificates.path("server.key"),
        ));
        spec.redis.tls = Some(RedisTls {
            cert_file: certificates.path("server.pem").into(),
            key_file: certificates.path("server.key").into(),
            ca_file: certificates.path("ca.pem").into(),
        });
    }
    let started = spec.start().await.and_then(|servers| match servers {
        (Nats::Server(nats), Redis::Server(redis)) => Ok((*nats, *redis)),
        _ => Err(anyhow!("a local fleet runs on one server of each")),
    });
    let (nats, redis) = progress.finish(started, |(nats, redis)| {
        format!("{} (v{}), {}", nats.url(), nats.version(), redis.url())
    })?;
    kill_switch.register_process(nats.process());
    kill_switch.register_process(redis.process());
    Ok((nats, redis))
}

/// The fleet's temp dir: registered with the kill switch unless it is
/// kept, and with the fleet's `fleet.log` in it when the tracing output
/// goes there.
fn fleet_dir(options: &LocalFleetOptions) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix("toolfleet-dev-")
        .tempdir()
        .context("cannot create a temp dir for the local fleet")?;
    if !options.keep_dir {
        options.kill_switch.register_dir(dir.path());
    }
    if options.log_to_file {
        FleetLog::install(&dir.path().join("fleet.log"))?;
    }
    Ok(dir)
}

impl LocalFleet {
    /// Starts the servers `spec` describes, then the orchestrator and
    /// the workers in this process, and returns once the orchestrator lists
    /// every worker's tools on every worker.
    ///
    /// # Errors
    ///
    /// The builder asks for what only a fleet of processes has (clusters,
    /// environment variables), a binary is missing or too old (the message
    /// says how to install one), a server or component did not come up in
    /// time (the message carries its log), or the gRPC port is taken.
    /// Whatever had started is stopped again.
    pub(crate) async fn start(spec: FleetSpec, options: LocalFleetOptions) -> anyhow::Result<Self> {
        let progress = Progress(options.progress);
        let shape = InProcess::of(spec)?;
        let dir = fleet_dir(&options)?;
        let deadline = options.start_timeout;
        let servers = ServerOptions {
            // Removed with the fleet's dir, or kept with it.
            parent_dir: Some(dir.path().to_owned()),
            // A Ctrl-C at the terminal must reach only us, so that the fleet
            // drains before its servers go.
            own_process_group: true,
            // Not a test: a failed start-up's error carries the log's tail.
            log_tail_on_drop: false,
            start_timeout: deadline,
            ..shape.servers.options.clone()
        };

        let tls = match shape.tls {
            true => Some(Certificates::generate(dir.path())?),
            false => None,
        };
        let (nats, redis) = start_servers(
            shape.servers.clone(),
            servers,
            tls.as_ref(),
            &options.kill_switch,
            progress,
        )
        .await?;

        let shutdown = CancellationToken::new();
        let stop_tasks = shutdown.clone().drop_guard();
        let mut fleet = Self {
            grpc_addr: SocketAddr::from(([127, 0, 0, 1], options.grpc_port)),
            progress,
            drain_bound: options
                .orchestrator
                .runner
                .drain_timeout
                .max(options.worker.runtime.drain_timeout)
                + toolfleet_service::binary::SHUTDOWN_MARGIN,
            keep_dir: options.keep_dir,
            kill_switch: options.kill_switch.clone(),
            shutdown,
            tasks: Vec::new(),
            _stop_tasks: stop_tasks,
            nats,
            redis,
            tls,
            dir,
        };
        fleet.start_services(&options, &shape).await?;
        Ok(fleet)
    }

    /// Starts the orchestrator, then the workers, and waits until the
    /// orchestrator lists every worker's tools on every worker.
    async fn start_services(
        &mut self,
        options: &LocalFleetOptions,
        shape: &InProcess,
    ) -> anyhow::Result<()> {
        let progress = self.progress;
        progress.start("starting orchestrator");
        let started = self.start_orchestrator(options).await;
        progress.finish(started, |()| format!("grpc {}", self.grpc_addr()))?;

        progress.start(&format!("starting {} workers", shape.workers));
        let started = self.start_workers(options, shape).await;
        let expected = progress.finish(started, |(ids, _)| ids.join(", "))?.1;

        progress.start("waiting for the workers' tools");
        let ready = self
            .wait_for_tools(&expected, shape.workers, options.start_timeout)
            .await;
        progress.finish(ready, |()| {
            format!("{} on {} workers each", expected.join(", "), shape.workers)
        })
    }

    /// The orchestrator's gRPC address as a URL, `http://127.0.0.1:<port>`:
    /// what `--addr` takes, and what `AgentServiceClient::connect` takes.
    pub fn grpc_addr(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    /// The socket the orchestrator serves gRPC on, `127.0.0.1:<port>`.
    pub fn grpc_socket_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn nats_url(&self) -> String {
        self.nats.url()
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn redis_url(&self) -> String {
        self.redis.url()
    }

    /// The NATS server (its process, its monitoring endpoint).
    pub fn nats(&self) -> &NatsServer {
        &self.nats
    }

    /// The Redis server (its process).
    pub fn redis(&self) -> &RedisServer {
        &self.redis
    }

    /// The temp dir: the servers' data and logs, and `fleet.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The log of the orchestrator and the workers (when
    /// [`LocalFleetOptions::log_to_file`] is on).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("fleet.log")
    }

    /// Kills the servers and removes the temp dir at once, from any thread;
    /// see [`KillSwitch`].
    pub fn kill_switch(&self) -> KillSwitch {
        self.kill_switch.clone()
    }

    /// The CA file NATS and Redis are trusted by, when they speak TLS.
    pub fn ca_file(&self) -> Option<String> {
        self.tls
            .as_ref()
            .map(|certificates| certificates.path("ca.pem"))
    }

    /// Stops the orchestrator and the workers and waits for them to drain
    /// (within their drain times and the margin `toolfleet_service::drain`
    /// keeps, whatever the servers do), then kills the servers and
    /// removes the temp dir (unless [`LocalFleetOptions::keep_dir`]).
    ///
    /// Everything is stopped and removed whatever happens; a component that
    /// failed or did not drain in time is reported on stderr, and `false`
    /// returned.
    pub async fn shutdown(self) -> bool {
        let Self {
            progress,
            drain_bound,
            keep_dir,
            kill_switch,
            shutdown,
            mut tasks,
            _stop_tasks,
            nats,
            redis,
            dir,
            ..
        } = self;
        progress.start("stopping orchestrator and workers");
        shutdown.cancel();
        let mut failures = Vec::new();
        let all = futures::future::join_all(tasks.iter_mut().map(|(_, task)| task));
        match tokio::time::timeout(drain_bound, all).await {
            Ok(results) => {
                for ((name, _), result) in tasks.iter().zip(results) {
                    match result {
                        Ok(Ok(())) => {}
                        Ok(Err(err)) => failures.push(format!("{name} failed: {err:#}")),
                        Err(err) => failures.push(format!("{name} panicked: {err}")),
                    }
                }
            }
            Err(_) => {
                for (name, task) in &tasks {
                    if !task.is_finished() {
                        task.abort();
                        failures.push(format!("{name} did not stop within {drain_bound:?}"));
                    }
                }
            }
        }
        progress.end(if failures.is_empty() { "ok" } else { "failed" });
        progress.start("stopping nats-server and redis-server");
        drop(nats);
        drop(redis);
        progress.end("ok");
        FleetLog::close();
        kill_switch.disarm();
        if keep_dir {
            let path = dir.keep();
            progress.note(&format!("kept {}", path.display()));
        } else {
            let path = dir.path().to_owned();
            if let Err(err) = dir.close() {
                failures.push(format!("cannot remove {}: {err}", path.display()));
            }
        }
        for failure in &failures {
            eprintln!("warning: local fleet: {failure}");
        }
        failures.is_empty()
    }

    async fn start_orchestrator(&mut self, options: &LocalFleetOptions) -> anyhow::Result<()> {
        let listener = tokio::net::TcpListener::bind(self.grpc_addr)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {} for gRPC; choose another port with --grpc-port \
                     (0 picks a free one)",
                    self.grpc_addr
                )
            })?;
        self.grpc_addr = listener.local_addr()?;
        let mut orchestrator = options.orchestrator.clone();
        orchestrator.instance_id = "dev-orchestrator".into();
        orchestrator.nats.url = self.nats.url();
        orchestrator.redis.url = self.redis.url();
        orchestrator.nats.tls.ca_file = self.ca_file();
        orchestrator.redis.tls.ca_file = self.ca_file();
        orchestrator.grpc.listen = self.grpc_addr;
        let orchestrator = Orchestrator::new(orchestrator);
        let shutdown = self.shutdown.child_token();
        let task = tokio::spawn(async move {
            orchestrator
                .run(listener, shutdown)
                .await
                .context("the orchestrator stopped")
        });
        self.tasks.push(("orchestrator".into(), task));
        Ok(())
    }

    /// Returns the worker ids and the names of the tools each serves.
    async fn start_workers(
        &mut self,
        options: &LocalFleetOptions,
        shape: &InProcess,
    ) -> anyhow::Result<(Vec<String>, Vec<String>)> {
        let mut ids = Vec::new();
        let mut tool_names = Vec::new();
        for n in 1..=shape.workers {
            let mut worker = options.worker.clone();
            worker.worker_id = format!("dev-worker-{n}");
            worker.nats.url = self.nats.url();
            worker.redis.url = self.redis.url();
            worker.nats.tls.ca_file = self.ca_file();
            worker.redis.tls.ca_file = self.ca_file();
            match &shape.serving {
                Serving::BuiltIn => {}
                Serving::TestTools => worker.test_tools = true,
                Serving::Tools(tools) => worker.tools.clone_from(tools),
            }
            let id = worker.worker_id.clone();
            let connected = Worker::connect(worker.clone())
                .await
                .with_context(|| format!("{id} cannot connect"))?;
            let toolbox = tools::builtin(worker.tool_selection(), connected.redis())
                .with_context(|| format!("{id} cannot build its tools"))?;
            tool_names = toolbox.manifests().into_iter().map(|m| m.name).collect();
            // The MCP servers of `worker.mcp` (`toolfleet dev
            // --worker-config`), beside the built-in tools, as
            // `toolfleet-worker` serves them; they stop after the drain.
            let servers = CancellationToken::new();
            let host = worker.mcp_host();
            let mcp = (&worker.mcp, &worker.tools, &connected.tools());
            toolfleet_worker::mcp::serve(mcp.0, &host, mcp.1, &tool_names, mcp.2, &servers);
            let shutdown = self.shutdown.child_token();
            let name = id.clone();
            let task = tokio::spawn(async move {
                let _stop_servers = servers.drop_guard();
                connected
                    .run(toolbox, shutdown)
                    .await
                    .with_context(|| format!("{name} stopped"))
            });
            self.tasks.push((id.clone(), task));
            ids.push(id);
        }
        tool_names.sort();
        Ok((ids, tool_names))
    }

    /// Polls `ListTools` until each of `expected` has `workers` workers.
    async fn wait_for_tools(
        &mut self,
        expected: &[String],
        workers: usize,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(10);
        let mut client: Option<ApiClient> = None;
        let mut last = String::from("no answer yet");
        loop {
            self.check_tasks().await?;
            if client.is_none() {
                match ApiClient::connect(self.grpc_addr()).await {
                    Ok(connected) => client = Some(connected),
                    Err(err) => last = format!("{err:#}"),
                }
            }
            if let Some(connected) = &mut client {
                match connected.list_tools(v1::ListToolsRequest::default()).await {
                    Ok(response) => {
                        let live: BTreeMap<String, u32> = response
                            .into_inner()
                            .tools
                            .into_iter()
                            .map(|t| (t.name, t.workers))
                            .collect();
                        let missing: Vec<String> = expected
                            .iter()
                            .filter_map(|name| {
                                let have = live.get(name).copied().unwrap_or(0);
                                (usize::try_from(have).unwrap_or(0) < workers)
                                    .then(|| format!("{name} on {have}/{workers} workers"))
                            })
                            .collect();
                        if missing.is_empty() {
                            return Ok(());
                        }
                        last = format!("ListTools shows {}", missing.join(", "));
                    }
                    Err(status) => last = format!("ListTools failed: {}", status.message()),
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "the orchestrator did not list the workers' tools within {timeout:?} ({last})\n{}",
                    supervisor::log_tail_report("fleet", &self.log_path())
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// Fails if a component already stopped, with its error.
    async fn check_tasks(&mut self) -> anyhow::Result<()> {
        if let Some(index) = self.tasks.iter().position(|(_, task)| task.is_finished()) {
            let (name, task) = self.tasks.swap_remove(index);
            let err = match task.await {
                Ok(Ok(())) => anyhow!("{name} stopped early"),
                Ok(Err(err)) => err,
                Err(err) => anyhow!("{name} panicked: {err}"),
            };
            return Err(err.context(supervisor::log_tail_report("fleet", &self.log_path())));
        }
        Ok(())
    }
}

/// Start-up and shutdown progress on stderr: `starting nats-server... ok (...)`.
#[derive(Debug, Clone, Copy)]
struct Progress(bool);

impl Progress {
    fn start(self, what: &str) {
        if self.0 {
            eprint!("{what}... ");
            let _ = std::io::stderr().flush();
        }
    }

    /// Ends the line started by [`start`](Self::start) with `ok (detail)` or
    /// `failed`, and passes `result` on.
    fn finish<T, E>(self, result: Result<T, E>, detail: impl FnOnce(&T) -> String) -> Result<T, E> {
        match &result {
            Ok(value) => self.end(&format!("ok ({})", detail(value))),
            Err(_) => self.end("failed"),
        }
        result
    }

    fn end(self, outcome: &str) {
        if self.0 {
            eprintln!("{outcome}");
        }
    }

    fn note(self, text: &str) {
        if self.0 {
            eprintln!("{text}");
        }
    }
}
