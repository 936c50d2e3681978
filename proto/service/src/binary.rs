//! The `main` of a service binary, around its options: print the config or
//! start logging, metrics and the signal watch, serve, and map the outcome to
//! an exit code (0 done, 1 failed, 2 bad configuration, 130 second signal).

use std::process::ExitCode;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, LogOptions, MetricsOptions};
use crate::{signals, telemetry};

/// What [`run`] needs to know of a service's options.
pub trait ServiceOptions: Serialize {
    /// Log output.
    fn log(&self) -> &LogOptions;
    /// The Prometheus endpoint.
    fn metrics(&self) -> &MetricsOptions;
    /// The options fit for printing and logging: every password in a URL
    /// hidden (secret fields are never serialized at all).
    fn redacted(&self) -> Self;
}

/// Runs the service `name` (`toolfleet-worker`) with the options `loaded`:
/// with `print_config`, prints them (redacted) and returns; otherwise
/// installs logging, logs the effective config, serves metrics if
/// configured, cancels the token given to `serve` on the first SIGTERM or
/// SIGINT, and awaits `serve`.
pub async fn run<O, F, Fut>(
    name: &str,
    loaded: Result<O, ConfigError>,
    print_config: bool,
    serve: F,
) -> ExitCode
where
    O: ServiceOptions,
    F: FnOnce(O, CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let options = match loaded {
        Ok(options) => options,
        Err(err) => {
            eprintln!("{name}: {err}");
            return ExitCode::from(2);
        }
    };
    if print_config {
        println!(
            "{}",
            serde_json::to_string_pretty(&options.redacted()).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    telemetry::init_logging(options.log());
    let served = async {
        tracing::info!(config = %serde_json::to_string(&options.redacted())?, "starting");
        if let Some(listen) = options.metrics().listen {
            telemetry::init_metrics(listen)?;
        }
        let shutdown = CancellationToken::new();
        tokio::spawn(signals::watch_signals(shutdown.clone()));
        serve(options, shutdown).await
    }
    .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "{name} failed");
            eprintln!("{name}: {err:#}");
            ExitCode::FAILURE
        }
    }
}
