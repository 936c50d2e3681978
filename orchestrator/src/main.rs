//! `toolfleet-orchestrator`: the gRPC API and the model loop.
//!
//! Stops on SIGTERM or SIGINT after draining running jobs (see
//! `toolfleet_orchestrator::server`); a second signal exits at once.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolfleet_orchestrator::{Orchestrator, OrchestratorOptions, cli, telemetry};
use toolfleet_worker::config::redact_url;

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
    let mut overrides = json!({});
    let mut set = |section: &str, key: &str, value: &Option<String>| {
        if let Some(value) = value {
            if section.is_empty() {
                overrides[key] = json!(value);
            } else {
                overrides[section][key] = json!(value);
            }
        }
    };
    set("nats", "url", &flags.nats_url);
    set("redis", "url", &flags.redis_url);
    set("grpc", "listen", &flags.listen);
    set("", "instance_id", &flags.instance_id);
    set("metrics", "listen", &flags.metrics_listen);
    let options = match OrchestratorOptions::load(flags.config.as_deref(), overrides) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("toolfleet-orchestrator: {err}");
            return ExitCode::from(2);
        }
    };
    if flags.print_config {
        println!(
            "{}",
            serde_json::to_string_pretty(&redacted(&options)).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    telemetry::init_logging(&options.log);
    match run(options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "orchestrator failed");
            eprintln!("toolfleet-orchestrator: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: OrchestratorOptions) -> anyhow::Result<()> {
    tracing::info!(config = %serde_json::to_string(&redacted(&options))?, "starting");
    if let Some(listen) = options.metrics.listen {
        telemetry::init_metrics(listen)?;
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(cli::watch_signals(shutdown.clone()));
    let listener = tokio::net::TcpListener::bind(options.grpc.listen).await?;
    Orchestrator::connect(options)
        .await?
        .run(listener, shutdown)
        .await?;
    Ok(())
}

/// The options with the Redis password hidden (the API key is never
/// serialized), for printing and logging.
fn redacted(options: &OrchestratorOptions) -> OrchestratorOptions {
    let mut shown = options.clone();
    shown.redis.url = redact_url(&shown.redis.url);
    shown
}
