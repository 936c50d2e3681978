//! The `main` of a worker binary: `toolfleet-worker`'s and your own.
//!
//! A worker of your own tools is a [`Toolbox`] and a few lines of `main`
//! around [`WorkerFlags`]: it takes the flags, configuration layers,
//! health and metrics endpoints, signals, drain and exit codes of
//! `toolfleet-worker` (`examples/custom-worker` in the repository is a
//! whole project):
//!
//! ```no_run
//! use clap::Parser;
//! use toolfleet_worker::Toolbox;
//! use toolfleet_worker::binary::WorkerFlags;
//!
//! /// Serves my tools from toolfleet's queues.
//! #[derive(Parser)]
//! #[command(version)]
//! struct Flags {
//!     #[command(flatten)]
//!     worker: WorkerFlags,
//!     // ... the flags of your tools (`#[arg(long, env = "...")]`).
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     let flags = Flags::parse();
//!     let toolbox = Toolbox::new(); // .with(YourTool::new(...))
//!     flags.worker.serve("my-worker", toolbox)
//! }
//! ```

use std::process::ExitCode;

use toolfleet_service::binary::{self, Process, ServiceFlags};
use toolfleet_service::config::{ConfigError, Overrides};

use crate::{Toolbox, Worker, WorkerOptions};

/// The flags and the `healthcheck` subcommand of every worker binary; a
/// binary adds its own flags next to them (`#[command(flatten)]`).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerFlags {
    #[command(subcommand)]
    command: Option<Command>,
    /// --config, --nats-url, --redis-url, --metrics-listen, --print-config.
    #[command(flatten)]
    pub service: ServiceFlags,
    /// Calls executed at once by this process (runtime.max_in_flight).
    #[arg(long, global = true)]
    pub max_in_flight: Option<usize>,
    /// Identity in the registry (worker_id).
    #[arg(long, global = true)]
    pub worker_id: Option<String>,
}

#[derive(Debug, Clone, clap::Subcommand)]
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
    /// Print the names of the tools this configuration serves, one per
    /// line, and exit: MCP tools by their fleet names. They are what
    /// `toolfleet-orchestrator setup --tools` and a pool's NATS and Redis
    /// users must cover (docs/tools/mcp.md, "Least privilege").
    Tools,
}

impl WorkerFlags {
    /// The worker's options: defaults < the `--config` file (or
    /// `$TOOLFLEET_CONFIG`) < `TOOLFLEET_*` variables < these flags <
    /// `more` (a binary's own flags, as keys).
    ///
    /// # Errors
    ///
    /// A file that cannot be read or a value of the wrong type, naming the key.
    pub fn load(
        &self,
        more: impl FnOnce(Overrides) -> Overrides,
    ) -> Result<WorkerOptions, ConfigError> {
        let overrides = more(self.service.overrides())
            .set("runtime.max_in_flight", self.max_in_flight)
            .set("worker_id", self.worker_id.as_ref())
            .into_value();
        WorkerOptions::load(self.service.config.as_deref(), overrides)
    }

    /// Runs the worker binary `name` that serves `toolbox`, as
    /// `toolfleet-worker` runs: the toolbox and the configuration are
    /// checked before anything connects (exit 2 when they cannot work),
    /// NATS and Redis are waited for, and SIGTERM drains (exit 0). The
    /// `tools` key selects among the toolbox's tools (empty: all of them);
    /// the keys of the built-in tools (`test_tools`, `kg`, `weather`) do
    /// not apply.
    pub fn serve(self, name: &str, toolbox: Toolbox) -> ExitCode {
        if let Err(err) = toolbox.check() {
            eprintln!("{name}: {err}");
            return ExitCode::from(2);
        }
        let options = self
            .load(|keys| keys)
            .map(|options| options.serving(&toolbox));
        self.main(name, options, move |options, process| async move {
            let selected = match options.tools.as_slice() {
                [] => toolbox,
                names => toolbox.only(names),
            };
            serve(options, process, |_| selected).await
        })
    }

    /// The `main` of the worker binary `name` with the `options` these
    /// flags [`load`](Self::load)ed: the `healthcheck` subcommand, or
    /// `--print-config`, or `serve` with the checked options on a runtime
    /// of their `threads`.
    pub fn main<F, Fut>(
        self,
        name: &str,
        options: Result<WorkerOptions, ConfigError>,
        serve: F,
    ) -> ExitCode
    where
        F: FnOnce(WorkerOptions, Process) -> Fut,
        Fut: Future<Output = anyhow::Result<()>>,
    {
        let threads = options.as_ref().map_or(0, |options| options.threads);
        binary::block_on(name, threads, async move {
            // With --print-config, `healthcheck` only prints the configuration.
            match self.command {
                _ if self.service.print_config => {}
                Some(Command::Healthcheck { live }) => {
                    return binary::healthcheck(name, options, live).await;
                }
                Some(Command::Tools) => return print_tools(name, options),
                None => {}
            }
            binary::run(name, options, self.service.print_config, serve).await
        })
    }
}

/// The `tools` subcommand: the checked configuration's tools, one a line.
fn print_tools(name: &str, options: Result<WorkerOptions, ConfigError>) -> ExitCode {
    match binary::configured(name, options) {
        Ok(options) => {
            for tool in options.served_tools() {
                println!("{tool}");
            }
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

/// Connects (waiting for NATS and Redis; a signal ends the wait) and serves
/// the toolbox `tools` makes with the worker's Redis connection until the
/// signal, then drains.
///
/// # Errors
///
/// A toolbox or JetStream setup that cannot work.
pub async fn serve(
    options: WorkerOptions,
    process: Process,
    tools: impl FnOnce(&Worker) -> Toolbox,
) -> anyhow::Result<()> {
    let (mcp, selected) = (options.mcp.clone(), options.tools.clone());
    let host = options.mcp_host();
    // Before any server starts: none may read this process's memory.
    crate::mcp::make_the_worker_undumpable();
    let worker = tokio::select! {
        worker = Worker::connect(options) => worker?,
        () = process.shutdown.cancelled() => return Ok(()),
    };
    // The MCP servers' tools beside the binary's own (docs/tools/mcp.md),
    // none of them under one of the binary's names.
    let own = tools(&worker);
    let taken: Vec<String> = own.manifests().into_iter().map(|m| m.name).collect();
    // The servers outlive the drain (their calls in flight finish), and
    // stop when this returns.
    let servers = tokio_util::sync::CancellationToken::new();
    let _stop_servers = servers.clone().drop_guard();
    crate::mcp::serve(&mcp, &host, &selected, &taken, &worker.tools(), &servers);
    worker
        .with_readiness(process.readiness)
        .run(own, process.shutdown)
        .await?;
    Ok(())
}
