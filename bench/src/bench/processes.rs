//! The production topology for `toolfleet bench --processes`: nats-server
//! (or a NATS cluster of 3, `--nats-cluster`), redis-server (or a Redis
//! Cluster of 3 primaries with a replica each, `--redis-cluster`), one
//! `toolfleet-orchestrator` process and N `toolfleet-worker` processes,
//! each worker serving the whole default tool set (the built-in tools and
//! the test tools). The in-process fleet of `toolfleet dev` shares one
//! process and one runtime; this one pays what a deployment pays, and
//! shows what one worker serving many tools does.

use std::time::Duration;

use anyhow::Context as _;
use toolfleet_proto::v1;
use toolfleet_service::config::TelemetryOptions;

use super::accounting::{Probe, Sources};
use toolfleet_fleet::servers::{Nats, Redis, RedisClusterShape, ServersSpec};
use toolfleet_fleet::supervisor::{
    ChildProcess, RedisConfig, ServerOptions, cargo_bin, logged_grpc_url,
};

/// How long each process may take to come up.
const READY: Duration = Duration::from_secs(60);

/// What fleet to start.
#[derive(Debug, Clone, Copy)]
pub(super) struct FleetShape {
    /// Worker processes.
    pub(super) workers: usize,
    /// Each worker's `runtime.max_in_flight`, if given.
    pub(super) max_in_flight: Option<usize>,
    /// The orchestrator's `runner.max_jobs`, if given.
    pub(super) max_jobs: Option<std::num::NonZeroUsize>,
    /// The `threads` of the orchestrator and each worker, and nats-server's
    /// `GOMAXPROCS` (0: each one's default).
    pub(super) threads: usize,
    /// JetStream and Redis fsync every write before acknowledging it.
    pub(super) fsync_always: bool,
    /// A NATS cluster of 3 nodes, each stream kept on all three.
    pub(super) nats_cluster: bool,
    /// A Redis Cluster of 3 primaries with a replica each.
    pub(super) redis_cluster: bool,
    /// The services' `redis.wait_replicas`, if given.
    pub(super) wait_replicas: Option<u32>,
    /// NATS runs the shipped accounts and users, and the workers are the
    /// pool `general` ([`Accounts`]).
    pub(super) nats_accounts: bool,
}

/// `--nats-accounts`: toolfleet's shipped NATS accounts and users
/// (decision 0029), with a password per user made for the run.
struct Accounts {
    /// `(user, the variable the users file reads its password from, password)`.
    users: Vec<(&'static str, &'static str, String)>,
}

/// The shipped accounts and users, as the chart renders them.
const SHIPPED_USERS: &str = include_str!("../../../deploy/nats/toolfleet-users.conf");
/// The pool the bench's workers are, and its tools (the shipped file's).
const POOL: &str = "pool-general";
const POOL_TOOLS: &str = "calculate,get_current_weather";

impl Accounts {
    fn new() -> Self {
        let users = [
            ("setup", "TOOLFLEET_NATS_SETUP_PASSWORD_BCRYPT"),
            (
                "orchestrator",
                "TOOLFLEET_NATS_ORCHESTRATOR_PASSWORD_BCRYPT",
            ),
            (
                "pool-general",
                "TOOLFLEET_NATS_POOL_GENERAL_PASSWORD_BCRYPT",
            ),
            (
                "pool-knowledge",
                "TOOLFLEET_NATS_POOL_KNOWLEDGE_PASSWORD_BCRYPT",
            ),
        ];
        let users = users
            .into_iter()
            .map(|(user, variable)| {
                // A loopback server for one run: unguessable is enough.
                let random = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), user);
                (user, variable, format!("{user}-{random:016x}"))
            })
            .collect();
        Self { users }
    }

    /// The server's configuration: the shipped file, with each password
    /// variable defined in it. In plaintext: a bcrypt hash costs only at
    /// connect time, and the bench needs no hashing of its own.
    fn server_config(&self) -> String {
        let mut config = String::new();
        for (_, variable, password) in &self.users {
            config.push_str(&format!("{variable}: \"{password}\"\n"));
        }
        config + SHIPPED_USERS
    }

    /// A service's NATS settings as `user`, as docs/security.md has them.
    fn env(&self, user: &str) -> Vec<(&'static str, String)> {
        let password = self
            .users
            .iter()
            .find(|(name, ..)| *name == user)
            .map(|(.., password)| password.clone())
            .unwrap_or_default();
        let mut env = vec![
            ("TOOLFLEET_NATS__USER", user.to_owned()),
            ("TOOLFLEET_NATS__PASSWORD", password),
            ("TOOLFLEET_NATS__INBOX_PREFIX", format!("_INBOX.{user}")),
            ("TOOLFLEET_NATS__CREATE_MISSING", "false".to_owned()),
        ];
        if user.starts_with("pool-") {
            env.push((
                "TOOLFLEET_NATS__API_PREFIX",
                toolfleet_proto::names::POOL_API_PREFIX.to_owned(),
            ));
        }
        env
    }

    /// Runs `toolfleet-orchestrator setup` as `setup` for the pool's tools.
    async fn set_up(&self, nats_url: &str) -> anyhow::Result<()> {
        let output = tokio::process::Command::new(cargo_bin("toolfleet-orchestrator")?)
            .args(["setup", "--nats-url", nats_url, "--tools", POOL_TOOLS])
            .envs(self.env("setup"))
            .output()
            .await
            .context("cannot run toolfleet-orchestrator setup")?;
        anyhow::ensure!(
            output.status.success(),
            "toolfleet-orchestrator setup failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }
}

/// The servers `shape` asks for, with `options`; with `accounts`, NATS runs
/// the shipped accounts and users and is set up as their `setup`.
async fn start_servers(
    shape: &FleetShape,
    options: &ServerOptions,
    accounts: Option<&Accounts>,
) -> anyhow::Result<(Nats, Redis)> {
    if shape.nats_cluster && (accounts.is_some() || shape.fsync_always) {
        anyhow::bail!(
            "--nats-cluster runs without --nats-accounts or --fsync-always (a cluster's nodes \
             have no configuration of their own here)"
        );
    }
    if accounts.is_some() && shape.fsync_always {
        anyhow::bail!("--nats-accounts is not supported with --fsync-always");
    }
    let spec = ServersSpec {
        nats_nodes: shape.nats_cluster.then_some(3),
        nats_config: accounts.map(Accounts::server_config),
        fsync_always: shape.fsync_always,
        redis_cluster: shape.redis_cluster.then_some(RedisClusterShape {
            primaries: 3,
            replicas: 1,
        }),
        redis: RedisConfig::default(),
        options: options.clone(),
    };
    let (nats, redis) = spec.start().await?;
    if let Some(accounts) = accounts {
        accounts.set_up(&nats.url()).await?;
    }
    Ok((nats, redis))
}

/// The environment every process of the fleet shares: its threads, where
/// it sends traces, and the servers' shape.
fn common_env(shape: &FleetShape, telemetry: &TelemetryOptions) -> Vec<(&'static str, String)> {
    let mut common = vec![("TOOLFLEET_THREADS", shape.threads.to_string())];
    if let Some(endpoint) = &telemetry.otlp_endpoint {
        common.push(("TOOLFLEET_TELEMETRY__OTLP_ENDPOINT", endpoint.clone()));
    }
    if let Some(ratio) = telemetry.sample_ratio {
        common.push(("TOOLFLEET_TELEMETRY__SAMPLE_RATIO", ratio.to_string()));
    }
    if shape.nats_cluster {
        common.push(("TOOLFLEET_NATS__REPLICAS", "3".to_owned()));
    }
    if shape.redis_cluster {
        common.push(("TOOLFLEET_REDIS__CLUSTER", "true".to_owned()));
    }
    if let Some(replicas) = shape.wait_replicas {
        common.push(("TOOLFLEET_REDIS__WAIT_REPLICAS", replicas.to_string()));
    }
    common
}

/// How the fleet's services are started: their connection flags, their
/// shared environment, and their NATS accounts when the fleet has them.
struct Launch<'a> {
    connection: [String; 4],
    common: Vec<(&'static str, String)>,
    accounts: Option<&'a Accounts>,
    options: &'a ServerOptions,
}

impl Launch<'_> {
    /// The orchestrator, on any free port, taking scripted jobs from anyone
    /// (the bench's jobs are scripted, on loopback).
    fn orchestrator(
        &self,
        max_jobs: Option<std::num::NonZeroUsize>,
    ) -> anyhow::Result<ChildProcess> {
        let mut args = self.connection.to_vec();
        args.extend(["--listen".to_owned(), "127.0.0.1:0".to_owned()]);
        let mut env = vec![
            ("TOOLFLEET_API__ALLOW_SCRIPTED", "true".to_owned()),
            ("TOOLFLEET_API__AUTH", "none".to_owned()),
        ];
        if let Some(jobs) = max_jobs {
            env.push(("TOOLFLEET_RUNNER__MAX_JOBS", jobs.to_string()));
        }
        env.extend(self.common.iter().cloned());
        if let Some(accounts) = self.accounts {
            env.extend(accounts.env("orchestrator"));
        }
        ChildProcess::spawn_with(
            "orchestrator",
            cargo_bin("toolfleet-orchestrator")?,
            &args,
            env.iter().map(|(k, v)| (*k, v.as_str())),
            self.options,
        )
    }

    /// Worker `n`: with the test tools, or, with NATS accounts, as the
    /// pool `general` serving its own tools only.
    fn worker(&self, n: usize, max_in_flight: Option<usize>) -> anyhow::Result<ChildProcess> {
        let mut args = self.connection.to_vec();
        let mut env = self.common.clone();
        match self.accounts {
            Some(accounts) => {
                args.extend(["--tools".to_owned(), POOL_TOOLS.to_owned()]);
                env.extend(accounts.env(POOL));
            }
            None => args.push("--test-tools".to_owned()),
        }
        args.extend(["--worker-id".to_owned(), format!("bench-worker-{n}")]);
        if let Some(slots) = max_in_flight {
            args.extend(["--max-in-flight".to_owned(), slots.to_string()]);
        }
        let env = env.iter().map(|(k, v)| (*k, v.as_str()));
        ChildProcess::spawn_with(
            &format!("worker-{n}"),
            cargo_bin("toolfleet-worker")?,
            &args,
            env,
            self.options,
        )
    }
}

/// The fleet; every process is killed and its dir removed on drop.
pub(super) struct ProcessFleet {
    /// The orchestrator's gRPC URL.
    pub(super) address: String,
    /// NATS, for the raw request/reply floor.
    pub(super) nats_url: String,
    // Declared before the servers, so that they are killed first.
    workers: Vec<ChildProcess>,
    orchestrator: ChildProcess,
    redis: Redis,
    nats: Nats,
    _dir: tempfile::TempDir,
}

impl ProcessFleet {
    /// Starts the servers, the orchestrator and the workers `shape` asks
    /// for, and returns once the orchestrator lists `tool` on every worker.
    /// Every process exports traces as `telemetry` says.
    pub(super) async fn start(
        shape: &FleetShape,
        tool: &str,
        telemetry: &TelemetryOptions,
    ) -> anyhow::Result<Self> {
        let FleetShape {
            workers,
            max_in_flight,
            max_jobs,
            threads,
            nats_accounts,
            ..
        } = *shape;
        let dir = tempfile::Builder::new()
            .prefix("toolfleet-bench-")
            .tempdir()
            .context("cannot create a temp dir for the bench fleet")?;
        // Quiet, in the bench's dir, in their own process group (a Ctrl-C
        // reaches only the bench, which then drops them).
        let options = ServerOptions {
            parent_dir: Some(dir.path().to_owned()),
            own_process_group: true,
            log_tail_on_drop: false,
            // Like the fleet's own processes (decision 0025).
            nats_threads: (threads > 0).then_some(threads),
            ..ServerOptions::default()
        };
        let accounts = nats_accounts.then(Accounts::new);
        let (nats, redis) = start_servers(shape, &options, accounts.as_ref()).await?;
        let launch = Launch {
            connection: [
                "--nats-url".to_owned(),
                nats.url(),
                "--redis-url".to_owned(),
                redis.url(),
            ],
            common: common_env(shape, telemetry),
            accounts: accounts.as_ref(),
            options: &options,
        };
        let orchestrator = launch.orchestrator(max_jobs)?;
        let spawned = (0..workers)
            .map(|n| launch.worker(n, max_in_flight))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let ready = orchestrator
            .wait_for_log("orchestrator ready", READY)
            .await?;
        let address =
            logged_grpc_url(&ready).with_context(|| format!("no gRPC address in {ready:?}"))?;
        let fleet = Self {
            address,
            nats_url: nats.url(),
            workers: spawned,
            orchestrator,
            redis,
            nats,
            _dir: dir,
        };
        fleet.wait_for_tool(tool, workers).await?;
        Ok(fleet)
    }

    /// Every process of the fleet and where its servers report.
    pub(super) fn sources(&self) -> Sources {
        let nats = self.nats.named();
        let redis = self.redis.named();
        let mut processes = vec![Probe::new("orchestrator", self.orchestrator.pid())];
        processes.extend(
            nats.iter()
                .map(|(name, node)| Probe::new(name, node.process().pid())),
        );
        processes.extend(
            redis
                .iter()
                .map(|(name, node)| Probe::new(name, node.process().pid())),
        );
        processes.extend(self.workers.iter().map(|w| Probe::new(w.name(), w.pid())));
        Sources {
            processes,
            redis_urls: redis.iter().map(|(_, node)| node.url()).collect(),
            nats_monitoring: nats.iter().map(|(_, node)| node.monitoring_url()).collect(),
        }
    }

    async fn wait_for_tool(&self, tool: &str, workers: usize) -> anyhow::Result<()> {
        let api = v1::agent_service_client::AgentServiceClient::connect(self.address.clone())
            .await
            .with_context(|| format!("cannot reach the orchestrator at {}", self.address))?;
        let what = format!("{tool} on {workers} worker processes");
        self.orchestrator
            .wait_until(&what, READY, || {
                let mut api = api.clone();
                async move {
                    let tools = api.list_tools(v1::ListToolsRequest {}).await.ok()?;
                    let live = tools.into_inner().tools;
                    let serving = live.iter().find(|t| t.name == tool)?.workers;
                    (usize::try_from(serving).unwrap_or(0) >= workers).then_some(())
                }
            })
            .await?;
        for worker in &self.workers {
            anyhow::ensure!(worker.is_running(), "{} exited", worker.name());
        }
        Ok(())
    }
}
