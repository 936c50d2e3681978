//! The production topology for `toolfleet bench --processes`: nats-server
//! (or a NATS cluster of 3, `--nats-cluster`), redis-server (or a Redis
//! Cluster of 3 primaries with a replica each, `--redis-cluster`), one
//! `toolfleet-orchestrator` process and N `toolfleet-worker` processes,
//! each worker serving the whole default tool set (the built-in tools and
//! the test tools). The in-process fleet of `toolfleet dev` shares one
//! process and one runtime; this one pays what a deployment pays, and
//! shows what one worker serving many tools does.

use anyhow::Context as _;
use toolfleet_proto::names;
use toolfleet_service::config::TelemetryOptions;

use super::accounting::{Probe, Sources};
use super::idle_tools::IdleTools;
use super::tenants::Tenants;
use toolfleet_fleet::processes;
use toolfleet_fleet::servers::RedisClusterShape;
use toolfleet_fleet::supervisor::{ServerOptions, cargo_bin};
use toolfleet_fleet::{FleetBuilder, Serving};

/// What fleet to start.
#[derive(Debug, Clone, Copy)]
pub(super) struct FleetShape {
    /// Worker processes.
    pub(super) workers: usize,
    /// Each worker's `runtime.max_in_flight`, if given.
    pub(super) max_in_flight: Option<usize>,
    /// The effects the workers declare `echo` with, if not its own.
    pub(super) echo_effects: Option<toolfleet_proto::manifest::Effects>,
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
            ("TOOLFLEET_NATS__INBOX_PREFIX", names::inbox_prefix(user)),
            ("TOOLFLEET_NATS__CREATE_MISSING", "false".to_owned()),
        ];
        if user.starts_with("pool-") {
            env.push((
                "TOOLFLEET_NATS__API_PREFIX",
                names::POOL_API_PREFIX.to_owned(),
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

/// What `shape` cannot run here.
fn check(shape: &FleetShape) -> anyhow::Result<()> {
    if shape.nats_cluster && (shape.nats_accounts || shape.fsync_always) {
        anyhow::bail!(
            "--nats-cluster runs without --nats-accounts or --fsync-always (a cluster's nodes \
             have no configuration of their own here)"
        );
    }
    if shape.nats_accounts && shape.fsync_always {
        anyhow::bail!("--nats-accounts is not supported with --fsync-always");
    }
    Ok(())
}

/// The environment every process of the fleet shares: its threads, where
/// it sends traces, and how many Redis replicas a write waits for.
fn common_env(shape: &FleetShape, telemetry: &TelemetryOptions) -> Vec<(&'static str, String)> {
    let mut common = vec![("TOOLFLEET_THREADS", shape.threads.to_string())];
    if let Some(endpoint) = &telemetry.otlp_endpoint {
        common.push(("TOOLFLEET_TELEMETRY__OTLP_ENDPOINT", endpoint.clone()));
    }
    if let Some(ratio) = telemetry.sample_ratio {
        common.push(("TOOLFLEET_TELEMETRY__SAMPLE_RATIO", ratio.to_string()));
    }
    if let Some(replicas) = shape.wait_replicas {
        common.push(("TOOLFLEET_REDIS__WAIT_REPLICAS", replicas.to_string()));
    }
    common
}

/// The fleet as `shape` describes it, without its services yet (with NATS
/// accounts, `setup` runs before them): every worker with the test tools,
/// or, with NATS accounts, as the pool `general` serving its own tools only.
fn builder(
    shape: &FleetShape,
    telemetry: &TelemetryOptions,
    accounts: Option<&Accounts>,
    options: ServerOptions,
) -> FleetBuilder {
    let mut worker_env = Vec::new();
    let mut orchestrator_env = Vec::new();
    if let Some(accounts) = accounts {
        worker_env.extend(accounts.env(POOL));
        orchestrator_env.extend(accounts.env("orchestrator"));
    }
    if let Some(slots) = shape.max_in_flight {
        worker_env.push(("TOOLFLEET_RUNTIME__MAX_IN_FLIGHT", slots.to_string()));
    }
    if let Some(effects) = shape.echo_effects {
        worker_env.push(("TOOLFLEET_RUNTIME__TOOL_EFFECTS__ECHO", effects.to_string()));
    }
    if let Some(jobs) = shape.max_jobs {
        orchestrator_env.push(("TOOLFLEET_RUNNER__MAX_JOBS", jobs.to_string()));
    }
    let serving = match accounts {
        Some(_) => Serving::Tools(POOL_TOOLS.split(',').map(str::to_owned).collect()),
        None => Serving::TestTools,
    };
    FleetBuilder::new()
        .workers(0)
        .orchestrators(0)
        .serving(serving)
        .nats_cluster(shape.nats_cluster.then_some(3))
        .nats_config(accounts.map(Accounts::server_config))
        .fsync_always(shape.fsync_always)
        .redis_cluster(shape.redis_cluster.then_some(RedisClusterShape {
            primaries: 3,
            replicas: 1,
        }))
        .server_options(options)
        .env(&borrowed(&common_env(shape, telemetry)))
        .worker_env(&borrowed(&worker_env))
        .orchestrator_env(&borrowed(&orchestrator_env))
}

/// `env` as the builder takes it.
fn borrowed<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    env.iter()
        .map(|(name, value)| (*name, value.as_str()))
        .collect()
}

/// What a fleet may have besides its shape: tenants that take tokens
/// (`--tenants`), an MCP server of idle tools (`--idle-tools`).
#[derive(Clone, Copy, Default)]
pub(super) struct Extras<'a> {
    pub(super) tenants: Option<&'a Tenants>,
    pub(super) idle_tools: Option<&'a IdleTools>,
}

/// The fleet; every process is killed and its dir removed on drop.
pub(super) struct ProcessFleet {
    /// The orchestrator's gRPC URL.
    pub(super) address: String,
    /// NATS, for the raw request/reply floor.
    pub(super) nats_url: String,
    fleet: processes::ProcessFleet,
    // Declared after the fleet, so that it goes once the processes are gone.
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
        Extras {
            tenants,
            idle_tools,
        }: Extras<'_>,
    ) -> anyhow::Result<Self> {
        check(shape)?;
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
            nats_threads: (shape.threads > 0).then_some(shape.threads),
            ..ServerOptions::default()
        };
        let accounts = shape.nats_accounts.then(Accounts::new);
        let worker_config = dir.path().join("worker.toml");
        let worker_config = match idle_tools {
            Some(tools) => {
                std::fs::write(&worker_config, tools.worker_config())
                    .with_context(|| format!("cannot write {}", worker_config.display()))?;
                Some(worker_config.to_string_lossy().into_owned())
            }
            None => None,
        };
        let mut builder = builder(shape, telemetry, accounts.as_ref(), options);
        if let Some(config) = &worker_config {
            builder = builder.worker_env(&[("TOOLFLEET_CONFIG", config.as_str())]);
        }
        let mut fleet = builder.start_processes().await?;
        if let Some(accounts) = &accounts {
            accounts.set_up(&fleet.nats.url()).await?;
        }
        let tokens_file = dir.path().join("tokens.toml");
        let tokens_path = tokens_file.to_string_lossy().into_owned();
        let mut orchestrator_env = Vec::new();
        if let Some(tenants) = tenants {
            std::fs::write(&tokens_file, tenants.file())
                .with_context(|| format!("cannot write {tokens_path}"))?;
            orchestrator_env = vec![
                ("TOOLFLEET_API__AUTH", "tokens"),
                ("TOOLFLEET_API__TOKENS_FILE", tokens_path.as_str()),
            ];
        }
        fleet.start_orchestrator(&orchestrator_env)?;
        for _ in 0..shape.workers {
            fleet.start_worker()?;
        }
        let address = fleet.grpc_url(0).await?;
        let workers = u32::try_from(shape.workers).unwrap_or(u32::MAX);
        let last_idle = idle_tools.and_then(IdleTools::last);
        let tools: Vec<&str> = std::iter::once(tool).chain(last_idle.as_deref()).collect();
        let token = tenants.map(|tenants| tenants.token(0));
        fleet.wait_for_tools_as(0, token, &tools, workers).await?;
        for worker in fleet.workers() {
            anyhow::ensure!(worker.is_running(), "{} exited", worker.name());
        }
        Ok(Self {
            address,
            nats_url: fleet.nats.url(),
            fleet,
            _dir: dir,
        })
    }

    /// Every process of the fleet and where its servers report.
    pub(super) fn sources(&self) -> Sources {
        let fleet = &self.fleet;
        let nats = fleet.nats.named();
        let redis = fleet.redis.named();
        let mut processes = vec![Probe::new("orchestrator", fleet.orchestrator(0).pid())];
        processes.extend(
            nats.iter()
                .map(|(name, node)| Probe::new(name, node.process().pid())),
        );
        processes.extend(
            redis
                .iter()
                .map(|(name, node)| Probe::new(name, node.process().pid())),
        );
        processes.extend(
            fleet
                .workers()
                .iter()
                .map(|w| Probe::new(w.name(), w.pid())),
        );
        Sources {
            processes,
            redis_urls: redis.iter().map(|(_, node)| node.url()).collect(),
            nats_monitoring: nats.iter().map(|(_, node)| node.monitoring_url()).collect(),
        }
    }
}
