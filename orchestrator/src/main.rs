//! `toolfleet-orchestrator`: the gRPC API and the model loop.
//!
//! Stops on SIGTERM or SIGINT after draining running jobs (see
//! `toolfleet_orchestrator::server`); a second signal exits at once.

use std::process::ExitCode;

use clap::Parser;
use toolfleet_orchestrator::{Orchestrator, OrchestratorOptions};
use toolfleet_service::binary::{self, Process, ServiceFlags};

/// Serves toolfleet's gRPC API and runs agent jobs.
///
/// Configuration is layered: defaults < --config TOML file < TOOLFLEET_* environment
/// (e.g. TOOLFLEET_GRPC__LISTEN, TOOLFLEET_RUNNER__MAX_JOBS) < these flags.
/// docs/configuration.md lists every key.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    #[command(flatten)]
    service: ServiceFlags,
    /// gRPC address to serve on (grpc.listen), e.g. 0.0.0.0:50051.
    #[arg(long)]
    listen: Option<String>,
    /// Identity in job leases (instance_id).
    #[arg(long)]
    instance_id: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let Flags {
        service,
        listen,
        instance_id,
    } = Flags::parse();
    let overrides = service
        .overrides()
        .set("grpc.listen", listen)
        .set("instance_id", instance_id)
        .into_value();
    let options = OrchestratorOptions::load(service.config.as_deref(), overrides);
    binary::run(
        "toolfleet-orchestrator",
        options,
        service.print_config,
        serve,
    )
    .await
}

async fn serve(options: OrchestratorOptions, process: Process) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(options.grpc.listen).await?;
    Orchestrator::new(options)
        .with_readiness(process.readiness)
        .run(listener, process.shutdown)
        .await?;
    Ok(())
}
