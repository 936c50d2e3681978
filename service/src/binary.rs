//! The `main` of a service binary, around its options: print the config or
//! start logging, metrics and the signal watch, serve, and map the outcome to
//! an exit code (0 done, 1 failed, 2 bad configuration, 130 second signal).

use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, LogOptions, MetricsOptions, Overrides, TelemetryOptions};
use crate::telemetry::Readiness;
use crate::{signals, telemetry, traces};

/// The flags every service binary takes; a binary adds its own next to them
/// with `#[command(flatten)]`. Global, so that a subcommand
/// (`toolfleet-worker healthcheck --metrics-listen ...`) takes them too.
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceFlags {
    /// TOML configuration file.
    #[arg(long, short, env = "TOOLFLEET_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// NATS server URL (nats.url).
    #[arg(long, global = true)]
    pub nats_url: Option<String>,
    /// Redis URL (redis.url).
    #[arg(long, global = true)]
    pub redis_url: Option<String>,
    /// Serve Prometheus metrics on this address, e.g. 0.0.0.0:9090 (metrics.listen).
    #[arg(long, global = true)]
    pub metrics_listen: Option<String>,
    /// Print the effective configuration (passwords hidden) as JSON and exit.
    #[arg(long, global = true)]
    pub print_config: bool,
}

impl ServiceFlags {
    /// The given flags as the last configuration layer; add the binary's own.
    pub fn overrides(&self) -> Overrides {
        Overrides::default()
            .set("nats.url", self.nats_url.as_ref())
            .set("redis.url", self.redis_url.as_ref())
            .set("metrics.listen", self.metrics_listen.as_ref())
    }
}

/// What [`run`] needs to know of a service's options.
pub trait ServiceOptions: Serialize {
    /// Log output.
    fn log(&self) -> &LogOptions;
    /// The Prometheus endpoint.
    fn metrics(&self) -> &MetricsOptions;
    /// OpenTelemetry export.
    fn telemetry(&self) -> &TelemetryOptions;
    /// The options fit for printing and logging: every password in a URL
    /// hidden (secret fields are never serialized at all).
    fn redacted(&self) -> Self;
    /// How long the drain may take after the first signal (the service's
    /// `drain_timeout`); the process exits at most [`SHUTDOWN_MARGIN`]
    /// later, whatever NATS and Redis do.
    fn drain_timeout(&self) -> std::time::Duration;
    /// Every check of the values that needs no server: run before anything
    /// connects, and by `--print-config`, so that a value that cannot work
    /// exits 2 at once rather than failing, or waiting, later.
    ///
    /// # Errors
    ///
    /// What is wrong, naming the key.
    fn check(&self) -> Result<(), String>;
}

/// How long after its drain time a service that has not stopped is made to
/// exit: room for the drain's last steps (handing jobs and calls back,
/// flushing NATS, the last telemetry export), which an outage or a hung
/// server can stall. Less than the 10 s the Helm chart's grace period adds
/// to the drain, so that the process ends before Kubernetes kills it.
pub const SHUTDOWN_MARGIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Once `shutdown` is cancelled, exits the process (status 1) if it is
/// still running `bound` later. A thread of its own, not a task: it must
/// fire even when the runtime's threads are stuck. What the process still
/// held is taken over as after a crash (leases expire, calls are
/// redelivered), which the services are built for.
async fn exit_if_stuck(shutdown: CancellationToken, bound: std::time::Duration, name: String) {
    shutdown.cancelled().await;
    std::thread::spawn(move || {
        std::thread::sleep(bound);
        tracing::error!(
            "{name} did not stop within {} s of the signal (its drain_timeout and {} s); \
             exiting: what it still held is taken over as after a crash",
            bound.as_secs(),
            SHUTDOWN_MARGIN.as_secs()
        );
        std::process::exit(1);
    });
}

/// Implements [`ServiceOptions`] for an options struct (which must be
/// `Clone`) with the sections every service has: `nats`, `redis`, `metrics`,
/// `telemetry` and `log`, and the path of its drain timeout
/// (`service_options!(WorkerOptions, runtime.drain_timeout)`). Its
/// [`ServiceOptions::check`] checks the shared sections, then calls the
/// service's own `fn check_own(&self) -> Result<(), String>`. A macro rather than a default method because the sections are
/// fields of each service's own struct.
#[macro_export]
macro_rules! service_options {
    ($options:ty, $($drain:ident).+) => {
        impl $crate::binary::ServiceOptions for $options {
            fn log(&self) -> &$crate::config::LogOptions {
                &self.log
            }

            fn metrics(&self) -> &$crate::config::MetricsOptions {
                &self.metrics
            }

            fn telemetry(&self) -> &$crate::config::TelemetryOptions {
                &self.telemetry
            }

            fn drain_timeout(&self) -> std::time::Duration {
                self.$($drain).+
            }

            fn check(&self) -> Result<(), String> {
                $crate::binary::check_shared(&self.nats, &self.redis)?;
                self.check_own()
            }

            fn redacted(&self) -> Self {
                let mut shown = self.clone();
                shown.nats.url = $crate::config::redact_url(&shown.nats.url);
                shown.redis.url = $crate::config::redact_url(&shown.redis.url);
                if let Some(endpoint) = &mut shown.telemetry.otlp_endpoint {
                    *endpoint = $crate::config::redact_url(endpoint);
                }
                shown
            }
        }
    };
}

/// The checks of the sections every service has ([`ServiceOptions::check`]):
/// the files NATS is connected with can be read, and a Redis client can be
/// built from the Redis settings (URL, `key_prefix`, TLS files, replica
/// acks).
///
/// # Errors
///
/// What is wrong, with its causes.
pub fn check_shared(
    nats: &crate::config::NatsOptions,
    redis: &crate::config::RedisOptions,
) -> Result<(), String> {
    let files = [
        ("nats.credentials_file", &nats.credentials_file),
        ("nats.nkey_seed_file", &nats.nkey_seed_file),
        ("nats.tls.ca_file", &nats.tls.ca_file),
        ("nats.tls.cert_file", &nats.tls.cert_file),
        ("nats.tls.key_file", &nats.tls.key_file),
    ];
    for (key, path) in files {
        if let Some(path) = path {
            std::fs::File::open(path).map_err(|err| format!("{key} {path}: {err}"))?;
        }
    }
    crate::connect::RedisClient::new(redis)
        .map(drop)
        .map_err(|err| format!("{:#}", anyhow::Error::new(err)))
}

/// What a service's `serve` gets from [`run`].
#[derive(Debug, Clone)]
pub struct Process {
    /// Cancelled by the first SIGTERM or SIGINT: drain, then return.
    pub shutdown: CancellationToken,
    /// Set it once the service serves, clear it when it drains: `/readyz`
    /// (on `metrics.listen`) answers from it.
    pub readiness: Readiness,
}

/// The options `loaded`, checked ([`ServiceOptions::check`]), or, when they
/// could not be loaded or cannot work, exit code 2 after saying why on
/// stderr as `name` (a binary or subcommand).
///
/// # Errors
///
/// The exit code for a bad configuration.
pub fn configured<O: ServiceOptions>(
    name: &str,
    loaded: Result<O, ConfigError>,
) -> Result<O, ExitCode> {
    let checked = loaded
        .map_err(|err| err.to_string())
        .and_then(|options| match options.check() {
            Ok(()) => Ok(options),
            Err(problem) => Err(format!("invalid configuration: {problem}")),
        });
    checked.map_err(|problem| {
        eprintln!("{name}: {problem}");
        ExitCode::from(2)
    })
}

/// The `healthcheck` subcommand of the service `name`: asks the health
/// endpoint that the options `loaded` configure (`metrics.listen`), and maps
/// the answer to an exit code (0 healthy, 1 not, 2 bad configuration).
pub async fn healthcheck<O: ServiceOptions>(
    name: &str,
    loaded: Result<O, ConfigError>,
    live: bool,
) -> ExitCode {
    let options = match configured(name, loaded) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let Some(listen) = options.metrics().listen else {
        eprintln!("{name}: no health endpoint: set metrics.listen (--metrics-listen)");
        return ExitCode::from(2);
    };
    match telemetry::check_health(listen, live).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{name}: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the service `name` (`toolfleet-worker`) with the options `loaded`:
/// with `print_config`, prints them (redacted) and returns; otherwise
/// installs logging, logs the effective config, serves metrics and the
/// health endpoints if `metrics.listen` is set, cancels the token given to
/// `serve` on the first SIGTERM or SIGINT, and awaits `serve`.
pub async fn run<O, F, Fut>(
    name: &str,
    loaded: Result<O, ConfigError>,
    print_config: bool,
    serve: F,
) -> ExitCode
where
    O: ServiceOptions,
    F: FnOnce(O, Process) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let options = match configured(name, loaded) {
        Ok(options) => options,
        Err(code) => return code,
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
        if toolfleet_proto::release::is_previous() {
            tracing::warn!(
                "playing the release before ({}=1, a test build's switch): format 1, no pinning",
                toolfleet_proto::release::PREVIOUS_RELEASE_ENV
            );
        }
        let exporting = traces::install(options.telemetry(), name)
            .map_err(|err| anyhow::anyhow!("telemetry: cannot export traces: {err}"))?;
        let listen = options.metrics().listen;
        let metrics = telemetry::install_metrics(listen.is_some(), options.telemetry(), name)
            .map_err(|err| anyhow::anyhow!("telemetry: cannot export metrics: {err}"))?;
        let readiness = Readiness::default();
        if let Some(listen) = listen {
            telemetry::serve_http(listen, readiness.clone(), &metrics).await?;
        }
        let shutdown = CancellationToken::new();
        tokio::spawn(signals::watch_signals(shutdown.clone()));
        let bound = options.drain_timeout() + SHUTDOWN_MARGIN;
        tokio::spawn(exit_if_stuck(shutdown.clone(), bound, name.to_owned()));
        let served = serve(
            options,
            Process {
                shutdown,
                readiness,
            },
        )
        .await;
        // The spans and metrics of the drain too.
        if let Some(exporting) = exporting {
            exporting.shutdown().await;
        }
        metrics.shutdown().await;
        served
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

/// The most threads a service runs its tasks on (the `threads` key): far
/// more than any machine's cores, and few enough to start.
pub const MAX_THREADS: usize = 1024;

/// Runs the binary `name`'s `main` on the runtime its `threads` key asks
/// for (0: one thread per CPU this process may use, its cgroup's limit
/// included). One thread gets tokio's single-threaded runtime, with no work
/// stealing: where several busy processes share few cores (the bench runs
/// five on two), the multi-threaded runtime's threads mostly wake each
/// other, and the single-threaded one cost the orchestrator about 20% less
/// CPU per job (docs/performance-history.md). A runtime that cannot be built (the
/// OS refused that many threads) exits 1, saying why; more than
/// [`MAX_THREADS`] is a bad configuration (exit 2).
pub fn block_on(name: &str, threads: usize, main: impl Future<Output = ExitCode>) -> ExitCode {
    if threads > MAX_THREADS {
        eprintln!("{name}: invalid configuration: threads is {threads}; at most {MAX_THREADS}");
        return ExitCode::from(2);
    }
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    match builder.enable_all().build() {
        Ok(runtime) => runtime.block_on(main),
        Err(err) => {
            eprintln!("{name}: cannot start a runtime of {threads} threads (threads): {err}");
            ExitCode::FAILURE
        }
    }
}
