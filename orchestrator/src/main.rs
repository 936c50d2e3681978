//! `toolfleet-orchestrator`: the gRPC API and the model loop.
//!
//! Stops on SIGTERM or SIGINT after draining running jobs (see
//! `toolfleet_orchestrator::server`); a second signal exits at once.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use toolfleet_orchestrator::{Orchestrator, OrchestratorOptions};
use toolfleet_service::binary;
use toolfleet_service::config::Overrides;

/// Serves toolfleet's gRPC API and runs agent jobs.
///
/// Configuration is layered: defaults < --config TOML file < TOOLFLEET_* environment
/// (e.g. TOOLFLEET_GRPC__LISTEN, TOOLFLEET_RUNNER__MAX_JOBS) < these flags.
/// docs/configuration.md lists every key.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    /// TOML configuration file.
    #[arg(long, short, env = "TOOLFLEET_CONFIG")]
    config: Option<PathBuf>,
    /// NATS server URL (nats.url).
    #[arg(long)]
    nats_url: Option<String>,
    /// Redis URL (redis.url).
    #[arg(long)]
    redis_url: Option<String>,
    /// gRPC address to serve on (grpc.listen), e.g. 0.0.0.0:50051.
    #[arg(long)]
    listen: Option<String>,
    /// Identity in job leases (instance_id).
    #[arg(long)]
    instance_id: Option<String>,
    /// Serve Prometheus metrics on this address (metrics.listen).
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    print_config: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    let overrides = Overrides::default()
        .set("nats.url", flags.nats_url.as_ref())
        .set("redis.url", flags.redis_url.as_ref())
        .set("grpc.listen", flags.listen.as_ref())
        .set("instance_id", flags.instance_id.as_ref())
        .set("metrics.listen", flags.metrics_listen.as_ref())
        .into_value();
    let options = OrchestratorOptions::load(flags.config.as_deref(), overrides);
    binary::run("toolfleet-orchestrator", options, flags.print_config, serve).await
}

async fn serve(options: OrchestratorOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(options.grpc.listen).await?;
    Orchestrator::connect(options)
        .await?
        .run(listener, shutdown)
        .await?;
    Ok(())
}
