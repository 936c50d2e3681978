//! `orders-worker`: serves the `order_status` tool from toolfleet's queues.
//!
//! It takes every flag, configuration key and `TOOLFLEET_*` variable of
//! `toolfleet-worker` (`--nats-url`, `--redis-url`, `--config`,
//! `--metrics-listen`, `--print-config`, the `healthcheck` subcommand),
//! plus its tool's own: `--orders-url` (`$ORDERS_URL`).

mod order_status;

use std::process::ExitCode;

use clap::Parser;
use toolfleet_worker::Toolbox;
use toolfleet_worker::binary::WorkerFlags;

use order_status::OrderStatus;

/// Answers the model's questions about orders, from the order service.
///
/// Configuration is layered as toolfleet-worker's: defaults < --config TOML
/// file < TOOLFLEET_* environment (TOOLFLEET_NATS__URL, ...) < these flags.
#[derive(Parser)]
#[command(version)]
struct Flags {
    #[command(flatten)]
    worker: WorkerFlags,
    /// The order service's base URL: the tool asks GET <URL>/orders/<id>.
    #[arg(long, env = "ORDERS_URL", default_value = "http://127.0.0.1:8080")]
    orders_url: reqwest::Url,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let toolbox = match OrderStatus::new(flags.orders_url) {
        Ok(tool) => Toolbox::new().with(tool),
        Err(err) => {
            eprintln!("orders-worker: {err}");
            return ExitCode::from(2);
        }
    };
    // Checks the toolbox and the configuration (exit 2), waits for NATS and
    // Redis, serves until SIGTERM, then drains: as toolfleet-worker does.
    flags.worker.serve("orders-worker", toolbox)
}
