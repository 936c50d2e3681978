//! An OTLP trace collector in the test process: the gRPC `TraceService` of
//! the OpenTelemetry protocol, built from `opentelemetry-proto`'s service
//! definitions, keeping every span it is sent, with the `service.name` of the
//! process that sent it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

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

    /// The value of attribute `key`, as text (`true`, `3`, `ok`).
    pub fn attribute(&self, key: &str) -> Option<String> {
        attribute(&self.span.attributes, key)
    }
}

/// A running collector; stops when dropped.
pub struct Collector {
    /// `http://127.0.0.1:<port>`, for `telemetry.otlp_endpoint`.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    _stop: DropGuard,
}

impl Collector {
    /// Starts a collector on a free loopback port.
    ///
    /// # Errors
    ///
    /// No port could be bound.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address: SocketAddr = listener.local_addr()?;
        let spans = Arc::new(Mutex::new(Vec::new()));
        let service = Receiver(spans.clone());
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let served = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(service))
                .serve_with_incoming_shutdown(incoming, stopped.cancelled_owned())
                .await;
            if let Err(err) = served {
                eprintln!("the OTLP collector stopped: {err}");
            }
        });
        Ok(Self {
            endpoint: format!("http://{address}"),
            spans,
            _stop: stop.drop_guard(),
        })
    }

    /// Every span received so far.
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

struct Receiver(Arc<Mutex<Vec<ReceivedSpan>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
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
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
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
        _ => return None,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
