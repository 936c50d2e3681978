//! `toolfleet-orchestrator`: the gRPC API and the model loop.
//!
//! Stops on SIGTERM or SIGINT after draining running jobs (see
//! `toolfleet_orchestrator::server`); a second signal exits at once.

use std::process::ExitCode;

/// mimalloc, not glibc's allocator: in a profile of the bench's load a
/// fifth of the orchestrator's CPU was in `malloc` and `free` (the Redis and
/// NATS clients' replies, gRPC frames), and mimalloc cut its CPU per job by
/// about 12% (docs/performance-history.md). Every binary uses it, built without
/// transparent huge pages (decision 0027).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use toolfleet_orchestrator::{Orchestrator, OrchestratorOptions, setup};
use toolfleet_service::binary::{self, Process, ServiceFlags};
use toolfleet_service::telemetry;

/// Serves toolfleet's gRPC API and runs agent jobs.
///
/// Configuration is layered: defaults < --config TOML file < TOOLFLEET_* environment
/// (e.g. TOOLFLEET_GRPC__LISTEN, TOOLFLEET_RUNNER__MAX_JOBS) < these flags.
/// docs/configuration.md lists every key.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    service: ServiceFlags,
    /// gRPC address to serve on (grpc.listen), e.g. 0.0.0.0:50051.
    #[arg(long)]
    listen: Option<String>,
    /// Identity in job leases (instance_id).
    #[arg(long)]
    instance_id: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create (or update to this configuration) every JetStream object of the
    /// fleet, then exit: the job and call streams, the orchestrators' consumer,
    /// one consumer per tool of every worker pool, and the registry bucket.
    /// Run it once per deployment, and again when a pool adds a tool, with a
    /// NATS user that may create them; the services then run with
    /// nats.create_missing = false and users that may not. Exit 0 when all is
    /// set up, 1 when JetStream refused something, 2 on bad configuration.
    Setup {
        /// The tools whose consumers to create, comma separated (setup.tools).
        #[arg(long, value_delimiter = ',')]
        tools: Vec<String>,
    },
    /// Exit 0 when an orchestrator with this configuration is ready (its
    /// `/readyz` on metrics.listen answers 200), 1 otherwise: for exec
    /// probes in images without a shell, and where the gRPC port speaks TLS
    /// (which the kubelet's gRPC probe cannot).
    Healthcheck {
        /// Only check that it is alive (`/healthz`): it may still be waiting
        /// for NATS or Redis.
        #[arg(long)]
        live: bool,
    },
    /// Print what GitOps needs to add a worker pool to a release whose
    /// passwords you manage (`credentials.existingSecret`): the pool's two
    /// new random passwords, as keys of that Secret (seal them; never commit
    /// them plain), and their hashes, as the chart's
    /// `credentials.passwordHashes` values (docs/deploy.md, "Adding a
    /// pool"). Reads no configuration and touches nothing. Exit 2 on a pool
    /// name the chart refuses.
    Credentials {
        /// The new pool's name, as in the chart's `pools` (1 to 32 lowercase
        /// letters, digits and -).
        #[arg(long)]
        pool: String,
        /// The Secret that `credentials.existingSecret` names.
        #[arg(long, default_value = "toolfleet-credentials")]
        secret: String,
    },
}

fn main() -> ExitCode {
    let Flags {
        command,
        service,
        listen,
        instance_id,
    } = Flags::parse();
    if let Some(Command::Credentials { pool, secret }) = &command {
        return print_credentials(pool, secret);
    }
    let tools = match &command {
        Some(Command::Setup { tools }) => Some(tools).filter(|t| !t.is_empty()),
        _ => None,
    };
    let overrides = service
        .overrides()
        .set("grpc.listen", listen)
        .set("instance_id", instance_id)
        .set("setup.tools", tools)
        .into_value();
    let options = OrchestratorOptions::load(service.config.as_deref(), overrides);
    let threads = options.as_ref().map_or(0, |options| options.threads);
    binary::block_on("toolfleet-orchestrator", threads, async move {
        // With --print-config, a subcommand only prints the configuration it
        // would run with: it never touches JetStream.
        match command {
            Some(Command::Setup { .. }) if !service.print_config => set_up(options).await,
            Some(Command::Healthcheck { live }) if !service.print_config => {
                binary::healthcheck("toolfleet-orchestrator", options, live).await
            }
            _ => {
                binary::run(
                    "toolfleet-orchestrator",
                    options,
                    service.print_config,
                    serve,
                )
                .await
            }
        }
    })
}

/// `credentials`: a new pool's passwords and their hashes, on stdout.
fn print_credentials(pool: &str, secret: &str) -> ExitCode {
    if let Err(why) = toolfleet_orchestrator::credentials::check_secret_name(secret) {
        eprintln!("toolfleet-orchestrator credentials: --secret: {why}");
        return ExitCode::from(2);
    }
    match toolfleet_orchestrator::credentials::PoolCredentials::generate(pool) {
        Ok(made) => {
            println!("{}", made.render(secret));
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("toolfleet-orchestrator credentials: --pool: {why}");
            ExitCode::from(2)
        }
    }
}

async fn serve(options: OrchestratorOptions, process: Process) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(options.grpc.listen).await?;
    Orchestrator::new(options)
        .with_readiness(process.readiness)
        .run(listener, process.shutdown)
        .await?;
    Ok(())
}

/// The `setup` subcommand: prints each object it set up.
async fn set_up(
    options: Result<OrchestratorOptions, toolfleet_service::config::ConfigError>,
) -> ExitCode {
    let options = match binary::configured("toolfleet-orchestrator setup", options) {
        Ok(options) => options,
        Err(code) => return code,
    };
    telemetry::init_logging(&options.log);
    match setup::run(&options).await {
        Ok(done) => {
            for what in done {
                println!("set up {what}");
            }
            ExitCode::SUCCESS
        }
        Err(err @ setup::SetupError::ToolName(_)) => {
            eprintln!("toolfleet-orchestrator setup: {err}");
            ExitCode::from(2)
        }
        Err(err) => {
            eprintln!(
                "toolfleet-orchestrator setup: {:#}",
                anyhow::Error::from(err)
            );
            ExitCode::FAILURE
        }
    }
}
