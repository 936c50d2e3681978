//! `toolfleet-worker`: serves the built-in tools from NATS JetStream.
//!
//! Stops on SIGTERM or SIGINT after draining in-flight calls (see
//! `toolfleet_worker::runtime`); a second signal exits at once.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolfleet_worker::config::redact_url;
use toolfleet_worker::{Worker, WorkerOptions, shutdown, telemetry, tools};

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
        let mut doc = json!({});
        let mut set = |path: &[&str], value: serde_json::Value| {
            let mut node = &mut doc;
            for key in &path[..path.len() - 1] {
                node = node
                    .as_object_mut()
                    .expect("overrides are objects")
                    .entry(*key)
                    .or_insert_with(|| json!({}));
            }
            node[path[path.len() - 1]] = value;
        };
        if let Some(v) = &self.nats_url {
            set(&["nats", "url"], json!(v));
        }
        if let Some(v) = &self.redis_url {
            set(&["redis", "url"], json!(v));
        }
        if let Some(v) = self.max_in_flight {
            set(&["runtime", "max_in_flight"], json!(v));
        }
        if !self.tools.is_empty() {
            set(&["tools"], json!(self.tools));
        }
        if self.test_tools {
            set(&["test_tools"], json!(true));
        }
        if let Some(v) = &self.worker_id {
            set(&["worker_id"], json!(v));
        }
        if let Some(v) = &self.metrics_listen {
            set(&["metrics", "listen"], json!(v));
        }
        doc
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    let options = match WorkerOptions::load(flags.config.as_deref(), flags.overrides()) {
        Ok(options) => options,
        Err(err) => {
            eprintln!("toolfleet-worker: {err}");
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
            tracing::error!(error = format!("{err:#}"), "worker failed");
            eprintln!("toolfleet-worker: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: WorkerOptions) -> anyhow::Result<()> {
    tracing::info!(config = %serde_json::to_string(&redacted(&options))?, "starting");
    if let Some(listen) = options.metrics.listen {
        telemetry::init_metrics(listen)?;
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown::watch_signals(shutdown.clone()));
    let worker = Worker::connect(options.clone()).await?;
    let toolbox = tools::builtin(&options, worker.redis())?;
    worker.run(toolbox, shutdown).await?;
    Ok(())
}

/// The options with the Redis password hidden, for printing and logging.
fn redacted(options: &WorkerOptions) -> WorkerOptions {
    let mut shown = options.clone();
    shown.redis.url = redact_url(&shown.redis.url);
    shown
}
