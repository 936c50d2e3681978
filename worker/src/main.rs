//! `toolfleet-worker`: serves the built-in tools from NATS JetStream.
//!
//! Stops on SIGTERM or SIGINT after draining in-flight calls (see
//! `toolfleet_worker::runtime`); a second signal exits at once.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use toolfleet_service::binary;
use toolfleet_service::config::Overrides;
use toolfleet_worker::{Worker, WorkerOptions, tools};

/// Executes whitelisted tool calls from NATS JetStream and answers each with an envelope.
///
/// Configuration is layered: defaults < --config TOML file < TOOLFLEET_* environment
/// (e.g. TOOLFLEET_NATS__URL, TOOLFLEET_RUNTIME__MAX_IN_FLIGHT) < these flags.
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
    /// Calls executed at once by this process (runtime.max_in_flight).
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// Serve only these tools (tools), comma separated.
    #[arg(long, value_delimiter = ',')]
    tools: Vec<String>,
    /// Also serve the test tools: echo, sleep, fail, panic, increment_counter (test_tools).
    #[arg(long)]
    test_tools: bool,
    /// Identity in the registry (worker_id).
    #[arg(long)]
    worker_id: Option<String>,
    /// Serve Prometheus metrics on this address, e.g. 0.0.0.0:9090 (metrics.listen).
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Print the effective configuration as TOML-like JSON and exit.
    #[arg(long)]
    print_config: bool,
}

impl Flags {
    /// The flags that were given, as a partial configuration document.
    fn overrides(&self) -> serde_json::Value {
        Overrides::default()
            .set("nats.url", self.nats_url.as_ref())
            .set("redis.url", self.redis_url.as_ref())
            .set("runtime.max_in_flight", self.max_in_flight)
            .set("tools", Some(&self.tools).filter(|t| !t.is_empty()))
            .set("test_tools", self.test_tools.then_some(true))
            .set("worker_id", self.worker_id.as_ref())
            .set("metrics.listen", self.metrics_listen.as_ref())
            .into_value()
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    let options = WorkerOptions::load(flags.config.as_deref(), flags.overrides());
    binary::run("toolfleet-worker", options, flags.print_config, serve).await
}

async fn serve(options: WorkerOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    let worker = Worker::connect(options.clone()).await?;
    let toolbox = tools::builtin(options.tool_selection(), worker.redis())?;
    worker.run(toolbox, shutdown).await?;
    Ok(())
}
