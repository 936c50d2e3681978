//! Logging and metrics set-up of every toolfleet service.

use std::io::IsTerminal;
use std::net::SocketAddr;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogOptions};

/// Installs the global tracing subscriber. `RUST_LOG` wins over `options.level`.
pub fn init_logging(options: &LogOptions) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(options.level.as_str()));
    // Colours only on a terminal: log files and collectors get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // try_init: a second init (tests, embedding) keeps the first subscriber.
    let _ = match options.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Serves Prometheus metrics on `listen` at `/metrics`.
///
/// # Errors
///
/// The address cannot be bound, or a recorder is already installed.
pub fn init_metrics(listen: SocketAddr) -> anyhow::Result<()> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(listen)
        .install()?;
    Ok(())
}
