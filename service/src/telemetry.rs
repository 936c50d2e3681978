//! Logging, metrics and health endpoints of every toolfleet service.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::EnvFilter;

use metrics_exporter_prometheus::PrometheusHandle;
use metrics_opentelemetry::{OpenTelemetryMetrics, OpenTelemetryRecorder};
use opentelemetry_sdk::metrics::SdkMeterProvider;

use crate::config::{LogFormat, LogOptions, OtlpProtocol, TelemetryOptions};
use crate::otlp::{self, Signal};

/// Dependencies that log at `info` for every message they receive, kept
/// to warnings unless the filter names them: rmcp logs each notification
/// an MCP server sends, so a server that floods them would flood the log.
const QUIET_DEPENDENCIES: [(&str, &str); 1] = [("rmcp", "rmcp=warn")];

/// Installs the global tracing subscriber. `RUST_LOG` wins over `options.level`.
pub fn init_logging(options: &LogOptions) {
    let directives = std::env::var("RUST_LOG").unwrap_or_else(|_| options.level.clone());
    let mut filter = EnvFilter::new(&directives);
    for (target, quiet) in QUIET_DEPENDENCIES {
        if let (false, Ok(quiet)) = (directives.contains(target), quiet.parse()) {
            filter = filter.add_directive(quiet);
        }
    }
    // Colours only on a terminal: log files and collectors get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // try_init: a second init (tests, embedding) keeps the first subscriber.
    let installed = match options.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
    if installed.is_ok() {
        log_panics();
    }
}

/// Panics, where any are left, go through the log like every other error
/// (one JSON line with `log.format = "json"`), with where they happened;
/// the process then does what it would have done (a task's panic ends the
/// task, the process keeps serving).
fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        let thread = std::thread::current();
        tracing::error!(
            panic = %message,
            location,
            thread = thread.name().unwrap_or("unnamed"),
            "panicked"
        );
    }));
}

/// Whether the process serves: false until its servers answer and its
/// set-up is done, and again once it drains. Cheap to clone; every clone is
/// the same flag.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready (or not).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    /// Whether the process is ready.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The paths of the HTTP endpoint, for probes and scrapers.
pub mod paths {
    /// Prometheus metrics.
    pub const METRICS: &str = "/metrics";
    /// Liveness: 200 while the process runs (it may be waiting for a server).
    pub const HEALTHZ: &str = "/healthz";
    /// Readiness: 200 once the process serves, 503 before and while it drains.
    pub const READYZ: &str = "/readyz";
}

/// Buckets of every duration histogram (metrics named `*_seconds`), in
/// seconds: from a millisecond (a no-op call) to five minutes (a slow model
/// turn or a long tool).
pub const DURATION_BUCKETS: [f64; 17] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// Buckets of the waits for people (a call held for approval): a second to
/// a day, where [`DURATION_BUCKETS`] end at five minutes.
pub const HUMAN_WAIT_BUCKETS: [f64; 12] = [
    1.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0,
];

/// The histograms of waits for people, which take [`HUMAN_WAIT_BUCKETS`]:
/// the orchestrator's time from a held call to its decision.
pub const HUMAN_WAITS: [&str; 1] = ["toolfleet_approval_wait_seconds"];

/// Where the process's metrics go: Prometheus (scraped from
/// [`serve_http`]) and OTLP (pushed), either, both or neither.
#[derive(Default)]
pub struct Metrics {
    prometheus: Option<PrometheusHandle>,
    otlp: Option<SdkMeterProvider>,
}

impl Metrics {
    /// Pushes the last OTLP export and stops.
    pub async fn shutdown(self) {
        if let Some(provider) = self.otlp {
            // The SDK's shutdown blocks its caller until the export task answers.
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
    }
}

/// Installs the recorder of the `metrics` facade: Prometheus when
/// `prometheus` (the process serves `/metrics`), OTLP when an endpoint is
/// configured for metrics (`telemetry.otlp_endpoint`, or the standard
/// variables; every `OTEL_METRIC_EXPORT_INTERVAL`, 60 s by default), both
/// through one fan-out. Must run inside the tokio runtime.
///
/// # Errors
///
/// A bad bucket list or OTLP endpoint, or a recorder already installed.
pub fn install_metrics(
    prometheus: bool,
    telemetry: &TelemetryOptions,
    service: &str,
) -> anyhow::Result<Metrics> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    // Real histograms, so that percentiles can be taken over replicas and
    // over time (a summary's quantiles cannot be added up).
    let prometheus = if prometheus {
        // A full name sorts before every suffix: it wins over `_seconds`.
        let mut builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &DURATION_BUCKETS)?;
        for name in HUMAN_WAITS {
            builder =
                builder.set_buckets_for_metric(Matcher::Full(name.into()), &HUMAN_WAIT_BUCKETS)?;
        }
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Built, not installed: its upkeep (draining histograms) is ours.
        let upkeep = handle.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                tick.tick().await;
                upkeep.run_upkeep();
            }
        });
        Some((recorder, handle))
    } else {
        None
    };
    let otlp = match otlp::target(telemetry, Signal::Metrics) {
        Some(target) => Some(otlp_meters(target, service)?),
        None => None,
    };
    let metrics = Metrics {
        prometheus: prometheus.as_ref().map(|(_, handle)| handle.clone()),
        otlp: otlp.as_ref().map(|(provider, _)| provider.clone()),
    };
    let taken =
        |err: &dyn std::fmt::Display| anyhow::anyhow!("cannot install the metrics recorder: {err}");
    match (prometheus, otlp) {
        (None, None) => {}
        (Some((recorder, _)), None) => {
            metrics::set_global_recorder(recorder).map_err(|e| taken(&e))?
        }
        (None, Some((_, recorder))) => {
            metrics::set_global_recorder(recorder).map_err(|e| taken(&e))?
        }
        (Some((prometheus, _)), Some((_, otlp))) => metrics::set_global_recorder(
            metrics_util::layers::FanoutBuilder::default()
                .add_recorder(prometheus)
                .add_recorder(otlp)
                .build(),
        )
        .map_err(|e| taken(&e))?,
    }
    Ok(metrics)
}

/// The OTLP meter provider and the `metrics` recorder that feeds it.
fn otlp_meters(
    target: otlp::Target,
    service: &str,
) -> anyhow::Result<(SdkMeterProvider, OpenTelemetryRecorder)> {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    use opentelemetry_sdk::metrics::{Aggregation, Instrument, Stream};

    let exporter = match target.protocol {
        OtlpProtocol::Grpc => {
            let mut builder = opentelemetry_otlp::MetricExporter::builder().with_tonic();
            if let Some(endpoint) = target.endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            builder.with_protocol(Protocol::Grpc).build()?
        }
        OtlpProtocol::HttpProtobuf => {
            let mut builder = opentelemetry_otlp::MetricExporter::builder().with_http();
            if let Some(endpoint) = target.endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            builder.with_protocol(Protocol::HttpBinary).build()?
        }
    };
    // Exported by a tokio task, like the spans (see decision 0014).
    let reader =
        opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    // The same buckets as Prometheus's for every duration.
    let durations = |instrument: &Instrument| {
        instrument.name().ends_with("_seconds").then(|| {
            Stream::builder()
                .with_aggregation(Aggregation::ExplicitBucketHistogram {
                    boundaries: DURATION_BUCKETS.to_vec(),
                    record_min_max: true,
                })
                .build()
                .ok()
        })?
    };
    let provider = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_view(durations)
        .with_resource(otlp::resource(service))
        .build();
    let meter = provider.meter("toolfleet");
    let recorder = OpenTelemetryRecorder::new(OpenTelemetryMetrics::new(meter));
    Ok((provider, recorder))
}

/// Serves, on `listen`, the Prometheus metrics of `metrics` at `/metrics`
/// (404 when the process has none), liveness at `/healthz` and `readiness`
/// at `/readyz`, for the life of the process.
///
/// # Errors
///
/// The address cannot be bound.
pub async fn serve_http(
    listen: SocketAddr,
    readiness: Readiness,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    use axum::http::StatusCode;
    use axum::routing::get;

    let metrics = metrics.prometheus.clone();
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let app = axum::Router::new()
        .route(
            paths::METRICS,
            get(move || {
                std::future::ready(match &metrics {
                    Some(metrics) => (StatusCode::OK, metrics.render()),
                    None => (StatusCode::NOT_FOUND, String::new()),
                })
            }),
        )
        .route(paths::HEALTHZ, get(|| std::future::ready("ok")))
        .route(
            paths::READYZ,
            get(move || {
                let answer = if readiness.is_ready() {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                };
                std::future::ready(answer)
            }),
        );
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(error = %err, "the metrics and health endpoint stopped");
        }
    });
    Ok(())
}

/// Asks the health endpoint on `listen` (this process's `metrics.listen`)
/// whether the service is ready, or with `live` only alive: for exec probes
/// in images without a shell or an HTTP client.
///
/// # Errors
///
/// The endpoint does not answer within 2 s, or answers other than 200; the
/// message says which.
pub async fn check_health(listen: SocketAddr, live: bool) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A service bound to every address answers on loopback.
    let mut address = listen;
    if address.ip().is_unspecified() {
        address.set_ip(match address {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let path = if live { paths::HEALTHZ } else { paths::READYZ };
    // A status line is all a probe needs: a request written by hand spares
    // the service crate an HTTP client.
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.take(1024).read_to_end(&mut answer).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(std::time::Duration::from_secs(2), ask)
        .await
        .map_err(|_| anyhow::anyhow!("http://{address}{path} did not answer within 2s"))?
        .map_err(|err| anyhow::anyhow!("cannot reach http://{address}{path}: {err}"))?;
    let status_line = String::from_utf8_lossy(&answer);
    let status_line = status_line.lines().next().unwrap_or_default();
    if status_line.split_whitespace().nth(1) == Some("200") {
        Ok(())
    } else {
        anyhow::bail!("http://{address}{path} answered {status_line:?}")
    }
}
