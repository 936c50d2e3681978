//! An OTLP collector in the test process, keeping every span it is sent with
//! the `service.name` of the process that sent it, and the names of the
//! metrics it is sent: the gRPC `TraceService` and `MetricsService` of the
//! OpenTelemetry protocol, built from `opentelemetry-proto`'s service
//! definitions, and their HTTP form (`POST /v1/traces`, `/v1/metrics`, with
//! protobuf bodies) on a port of their own. The trace
//! tests read what it kept; `toolfleet bench --trace-ratio` starts one that
//! only counts, so that tracing costs what exporting costs.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio_util::sync::{CancellationToken, DropGuard};

/// A span as the collector received it.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The `service.name` of the process that exported it.
    pub service: String,
    /// The span.
    pub span: Span,
}

impl ReceivedSpan {
    /// The trace id, in hex.
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    /// The span id, in hex.
    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    /// The parent's span id in hex; empty for a root.
    pub fn parent_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    /// The value of attribute `key`, as text (`true`, `3`, `ok`; a list as
    /// a JSON array of its items' texts, `["stop"]`).
    pub fn attribute(&self, key: &str) -> Option<String> {
        attribute(&self.span.attributes, key)
    }
}

/// A running collector; stops when dropped.
pub struct Collector {
    /// Spans received, kept or not.
    received: Arc<std::sync::atomic::AtomicU64>,
    /// `http://127.0.0.1:<port>` of OTLP over gRPC, for
    /// `telemetry.otlp_endpoint`.
    pub endpoint: String,
    /// `http://127.0.0.1:<port>` of OTLP over HTTP (`http/protobuf`).
    pub http_endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    metrics: Arc<Mutex<BTreeSet<String>>>,
    _stop: DropGuard,
}

impl Collector {
    /// Starts a collector that keeps every span, on free loopback ports.
    ///
    /// # Errors
    ///
    /// No port could be bound.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_keeping(true).await
    }

    /// Starts a collector that only counts the spans it receives.
    ///
    /// # Errors
    ///
    /// No port could be bound.
    pub async fn counting() -> anyhow::Result<Self> {
        Self::start_keeping(false).await
    }

    async fn start_keeping(keep: bool) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address: SocketAddr = listener.local_addr()?;
        let http_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let http_address: SocketAddr = http_listener.local_addr()?;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let metrics = Arc::new(Mutex::new(BTreeSet::new()));
        let receiver = Receiver {
            spans: keep.then(|| spans.clone()),
            received: received.clone(),
            metrics: metrics.clone(),
        };
        let service = receiver.clone();
        let stop = CancellationToken::new();
        let http = axum::Router::new()
            .route(
                "/v1/metrics",
                http_export::<ExportMetricsServiceRequest, ExportMetricsServiceResponse>({
                    let receiver = receiver.clone();
                    move |request| receiver.keep_metrics(&request)
                }),
            )
            .route(
                "/v1/traces",
                http_export::<ExportTraceServiceRequest, ExportTraceServiceResponse>({
                    let receiver = receiver.clone();
                    move |request| receiver.keep(request)
                }),
            );
        let http_stopped = stop.clone();
        tokio::spawn(async move {
            let served = axum::serve(http_listener, http)
                .with_graceful_shutdown(http_stopped.cancelled_owned())
                .await;
            if let Err(err) = served {
                eprintln!("the OTLP/HTTP collector stopped: {err}");
            }
        });
        let stopped = stop.clone();
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let served = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(service.clone()))
                .add_service(MetricsServiceServer::new(service))
                .serve_with_incoming_shutdown(incoming, stopped.cancelled_owned())
                .await;
            if let Err(err) = served {
                eprintln!("the OTLP collector stopped: {err}");
            }
        });
        Ok(Self {
            endpoint: format!("http://{address}"),
            http_endpoint: format!("http://{http_address}"),
            received,
            spans,
            metrics,
            _stop: stop.drop_guard(),
        })
    }

    /// The names of the metrics received so far.
    pub fn metric_names(&self) -> BTreeSet<String> {
        self.metrics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many spans were received so far.
    pub fn received(&self) -> u64 {
        self.received.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every span received so far (none from a [`counting`](Self::counting)
    /// collector).
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The environment that makes a toolfleet process export here, promptly
    /// (every 50 ms rather than every 5 s).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("TOOLFLEET_TELEMETRY__OTLP_ENDPOINT", self.endpoint.clone()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50".to_owned()),
        ]
    }
}

#[derive(Clone)]
struct Receiver {
    spans: Option<Arc<Mutex<Vec<ReceivedSpan>>>>,
    received: Arc<std::sync::atomic::AtomicU64>,
    metrics: Arc<Mutex<BTreeSet<String>>>,
}

impl Receiver {
    fn keep_metrics(&self, request: &ExportMetricsServiceRequest) {
        let names = request
            .resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .map(|m| m.name.clone());
        self.metrics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(names);
    }

    fn keep(&self, request: ExportTraceServiceRequest) {
        let Some(spans) = &self.spans else {
            let count: usize = request
                .resource_spans
                .iter()
                .flat_map(|r| &r.scope_spans)
                .map(|s| s.spans.len())
                .sum();
            self.received
                .fetch_add(count as u64, std::sync::atomic::Ordering::Relaxed);
            return;
        };
        let mut received = Vec::new();
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| attribute(&r.attributes, "service.name"))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    received.push(ReceivedSpan {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
        self.received
            .fetch_add(received.len() as u64, std::sync::atomic::Ordering::Relaxed);
        spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(received);
    }
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.keep_metrics(request.get_ref());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.keep(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The HTTP form of an OTLP export: a protobuf `Req` body, handed to
/// `keep`, answered with an empty protobuf `Resp` (no partial success); a
/// body that does not decode gets 400.
fn http_export<Req, Resp>(
    keep: impl Fn(Req) + Clone + Send + Sync + 'static,
) -> axum::routing::MethodRouter
where
    Req: prost::Message + Default + 'static,
    Resp: prost::Message + Default,
{
    axum::routing::post(move |body: bytes::Bytes| {
        let answer = match Req::decode(body) {
            Ok(request) => {
                keep(request);
                (axum::http::StatusCode::OK, Resp::default().encode_to_vec())
            }
            Err(_) => (axum::http::StatusCode::BAD_REQUEST, Vec::new()),
        };
        std::future::ready(answer)
    })
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    text(value)
}

fn text(value: &AnyValue) -> Option<String> {
    Some(match value.value.as_ref()? {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::BoolValue(b) => b.to_string(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::DoubleValue(d) => d.to_string(),
        // A list as a JSON array of its items' texts.
        any_value::Value::ArrayValue(array) => {
            let items: Vec<String> = array.values.iter().filter_map(text).collect();
            serde_json::to_string(&items).ok()?
        }
        _ => return None,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
