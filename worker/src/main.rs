//! `toolfleet-worker`: serves the built-in tools from NATS JetStream.
//!
//! Stops on SIGTERM or SIGINT after draining in-flight calls (see
//! `toolfleet_worker::runtime`); a second signal exits at once.

use std::process::ExitCode;

/// mimalloc, not glibc's allocator, as in the orchestrator: in a profile of
/// the bench's load about a fifth of a worker's CPU was in glibc's `malloc`
/// and `free` (the NATS and Redis clients' messages and replies); mimalloc
/// cut the workers' CPU per job by about 15% for about 2 MB more memory,
/// well inside their 30 MB (decision 0027).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use toolfleet_service::binary::{self, Process, ServiceFlags};
use toolfleet_worker::{Worker, WorkerOptions, tools};

/// Executes whitelisted tool calls from NATS JetStream and answers each with an envelope.
///
/// Configuration is layered: defaults < --config TOML file < TOOLFLEET_* environment
/// (e.g. TOOLFLEET_NATS__URL, TOOLFLEET_RUNTIME__MAX_IN_FLIGHT) < these flags.
/// docs/configuration.md lists every key.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    service: ServiceFlags,
    /// Calls executed at once by this process (runtime.max_in_flight).
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// Serve only these tools (tools), comma separated.
    #[arg(long, value_delimiter = ',')]
    tools: Vec<String>,
    #[arg(long, help = tools::TEST_TOOLS_HELP)]
    test_tools: bool,
    /// The knowledge graph of factual_qa and trend_analysis, a JSON Lines file of
    /// facts (kg.graph_path). Default: the sample graph built into the binary.
    #[arg(long, value_name = "FILE")]
    kg_graph: Option<std::path::PathBuf>,
    /// Identity in the registry (worker_id).
    #[arg(long)]
    worker_id: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Exit 0 when a worker with this configuration is ready (its
    /// `/readyz` on metrics.listen answers 200), 1 otherwise: for exec
    /// probes in images without a shell.
    Healthcheck {
        /// Only check that it is alive (`/healthz`): it may still be waiting
        /// for NATS or Redis.
        #[arg(long)]
        live: bool,
    },
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let overrides = flags
        .service
        .overrides()
        .set("runtime.max_in_flight", flags.max_in_flight)
        .set("tools", Some(&flags.tools).filter(|t| !t.is_empty()))
        .set("test_tools", flags.test_tools.then_some(true))
        .set("worker_id", flags.worker_id.as_ref())
        .set("kg.graph_path", flags.kg_graph.as_ref())
        .into_value();
    let options = WorkerOptions::load(flags.service.config.as_deref(), overrides);
    let threads = options.as_ref().map_or(0, |options| options.threads);
    binary::block_on("toolfleet-worker", threads, async move {
        // With --print-config, `healthcheck` only prints the configuration.
        if let Some(Command::Healthcheck { live }) = flags.command
            && !flags.service.print_config
        {
            return binary::healthcheck("toolfleet-worker", options, live).await;
        }
        binary::run(
            "toolfleet-worker",
            options,
            flags.service.print_config,
            serve,
        )
        .await
    })
}

async fn serve(options: WorkerOptions, process: Process) -> anyhow::Result<()> {
    // Built (the graph read) before any connection: a bad graph fails now,
    // not once NATS and Redis answer.
    let tools = tools::prepare(options.tool_selection())?;
    // Waits for NATS and Redis; a signal ends the wait.
    let worker = tokio::select! {
        worker = Worker::connect(options.clone()) => worker?,
        () = process.shutdown.cancelled() => return Ok(()),
    };
    let toolbox = tools.with_redis(worker.redis());
    worker
        .with_readiness(process.readiness)
        .run(toolbox, process.shutdown)
        .await?;
    Ok(())
}
