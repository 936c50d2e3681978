//! `toolfleet-worker`: serves the built-in tools from NATS JetStream.
//!
//! Stops on SIGTERM or SIGINT after draining in-flight calls (see
//! `toolfleet_worker::runtime`); a second signal exits at once.

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use toolfleet_service::binary::{self, ServiceFlags};
use toolfleet_worker::{Worker, WorkerOptions, tools};

/// Executes whitelisted tool calls from NATS JetStream and answers each with an envelope.
///
/// Configuration is layered: defaults < --config TOML file < TOOLFLEET_* environment
/// (e.g. TOOLFLEET_NATS__URL, TOOLFLEET_RUNTIME__MAX_IN_FLIGHT) < these flags.
/// docs/configuration.md lists every key.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    #[command(flatten)]
    service: ServiceFlags,
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
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    let overrides = flags
        .service
        .overrides()
        .set("runtime.max_in_flight", flags.max_in_flight)
        .set("tools", Some(&flags.tools).filter(|t| !t.is_empty()))
        .set("test_tools", flags.test_tools.then_some(true))
        .set("worker_id", flags.worker_id.as_ref())
        .into_value();
    let options = WorkerOptions::load(flags.service.config.as_deref(), overrides);
    binary::run(
        "toolfleet-worker",
        options,
        flags.service.print_config,
        serve,
    )
    .await
}

async fn serve(options: WorkerOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    let worker = Worker::connect(options.clone()).await?;
    let toolbox = tools::builtin(options.tool_selection(), worker.redis())?;
    worker.run(toolbox, shutdown).await?;
    Ok(())
}
