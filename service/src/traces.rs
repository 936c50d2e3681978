//! OpenTelemetry traces: one trace per job, across every process, exported
//! over OTLP when `telemetry.otlp_endpoint` (or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`) is set, and nothing at all otherwise.
//!
//! A span reaches the collector only when it ends, and a process killed with
//! spans open loses them. So nothing here is long-lived:
//! - the job's root span ends when the job is submitted; its context is
//!   stored with the job ([`JobTrace`]), and every later span of the job is
//!   a child of that stored context, in whichever process runs it;
//! - the spans of a job's steps (a run, a model turn, a tool call, an
//!   attempt) get ids derived from the job's trace and the step's name
//!   ([`JobTrace::step`]), so a replica that resumes a job after a crash
//!   records the very span the dead one left open, under the same id, and
//!   the children the dead one did export (a Redis commit, a worker's
//!   execution) keep their parent;
//! - a span is recorded as plain data and handed to the SDK only when it
//!   ends ([`StepSpan::end`]): one dropped on the way (a round handed back at
//!   shutdown) is never exported, so it cannot show up twice when its step
//!   is resumed elsewhere.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    Link, Span as _, SpanId, Status, TraceContextExt, TraceId, Tracer, TracerProvider,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SdkTracer, SdkTracerProvider,
    span_processor_with_async_runtime::BatchSpanProcessor,
};
use sha2::{Digest, Sha256};
use toolfleet_proto::Envelope;
use toolfleet_proto::names::{self, span_attributes};

pub use opentelemetry::trace::{SpanContext, SpanKind};

use crate::config::{OtlpProtocol, TelemetryOptions};
use crate::otlp::{self, Signal};

/// Whether spans are exported: set once, by [`install`].
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The tracer of this process, once [`install`]ed.
static TRACER: std::sync::OnceLock<SdkTracer> = std::sync::OnceLock::new();

/// Whether this process exports spans.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The exporter of this process; shut it down to send what is buffered.
pub struct Exporting {
    provider: SdkTracerProvider,
}

impl Exporting {
    /// Sends the spans still buffered (within the exporter's timeout) and
    /// stops exporting.
    pub async fn shutdown(self) {
        // The SDK's shutdown blocks its caller until the export task answers.
        let provider = self.provider;
        let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    }
}

/// Starts exporting spans of the service `service` (its `service.name`,
/// unless `OTEL_SERVICE_NAME` names it) when an endpoint is configured.
/// Must run inside the tokio runtime: the export runs on its tasks.
///
/// # Errors
///
/// The exporter cannot be built from the options (a bad endpoint URL).
pub fn install(options: &TelemetryOptions, service: &str) -> anyhow::Result<Option<Exporting>> {
    let Some(target) = otlp::target(options, Signal::Traces) else {
        return Ok(None);
    };
    let exporter = match target.protocol {
        OtlpProtocol::Grpc => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if let Some(endpoint) = target.endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            builder.with_protocol(Protocol::Grpc).build()?
        }
        OtlpProtocol::HttpProtobuf => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder().with_http();
            if let Some(endpoint) = target.endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            builder.with_protocol(Protocol::HttpBinary).build()?
        }
    };
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let mut provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_id_generator(StepIds::default())
        .with_resource(otlp::resource(service));
    // Unset, the SDK reads OTEL_TRACES_SAMPLER(_ARG), else samples every
    // job. Children follow their job's decision, which travels with it.
    if let Some(ratio) = options.sample_ratio {
        provider = provider.with_sampler(Sampler::ParentBased(Box::new(
            Sampler::TraceIdRatioBased(ratio),
        )));
    }
    let provider = provider.build();
    let _ = TRACER.set(provider.tracer("toolfleet"));
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Some(Exporting { provider }))
}

thread_local! {
    /// The id the next span built on this thread gets, when it is a step's
    /// ([`StepSpan::end`] sets it right before building, on the same thread).
    static NEXT_SPAN_ID: Cell<Option<SpanId>> = const { Cell::new(None) };
}

/// Random ids, except for a step's span, whose id is derived from its job.
/// The SDK takes no span id from a span builder, hence this generator.
#[derive(Debug, Default)]
struct StepIds(RandomIdGenerator);

impl IdGenerator for StepIds {
    fn new_trace_id(&self) -> TraceId {
        self.0.new_trace_id()
    }

    fn new_span_id(&self) -> SpanId {
        NEXT_SPAN_ID
            .with(Cell::take)
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

/// W3C trace context from the values of the `traceparent` and `tracestate`
/// headers (gRPC metadata, NATS headers): `None` unless `traceparent` is
/// valid. A malformed one is ignored, never an error: the caller's tracing
/// is not the job's business.
pub fn extract(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<SpanContext> {
    struct Headers<'a>(Option<&'a str>, Option<&'a str>);
    impl Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            match key {
                names::headers::TRACEPARENT => self.0,
                names::headers::TRACESTATE => self.1,
                _ => None,
            }
        }
        fn keys(&self) -> Vec<&str> {
            vec![names::headers::TRACEPARENT, names::headers::TRACESTATE]
        }
    }
    let context = TraceContextPropagator::new().extract(&Headers(traceparent, tracestate));
    let span = context.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// The W3C headers (`traceparent`, and `tracestate` when it has entries)
/// that make `span` the parent of the receiver's spans.
pub fn headers(span: &SpanContext) -> Vec<(&'static str, String)> {
    struct Collect(Vec<(&'static str, String)>);
    impl Injector for Collect {
        fn set(&mut self, key: &str, value: String) {
            let name = match key {
                names::headers::TRACEPARENT => names::headers::TRACEPARENT,
                _ => names::headers::TRACESTATE,
            };
            if !value.is_empty() {
                self.0.push((name, value));
            }
        }
    }
    let mut collect = Collect(Vec::new());
    let context = Context::new().with_remote_span_context(span.clone());
    TraceContextPropagator::new().inject_context(&context, &mut collect);
    collect.0
}

/// A job's trace: the context of its root span, stored with the job so that
/// any replica continues it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobTrace(SpanContext);

impl JobTrace {
    /// Opens the trace of a job being submitted: with tracing on, its root
    /// span `name` (a child of the client's `parent`, if it sent one), to
    /// end once the job is stored; with tracing off, the client's context as
    /// it came, and a span that records nothing.
    pub fn begin(parent: Option<SpanContext>, name: &'static str) -> (Option<Self>, RootSpan) {
        let Some(tracer) = TRACER.get().filter(|_| enabled()) else {
            return (parent.map(Self), RootSpan(None));
        };
        let context = parent.map_or_else(Context::new, |parent| {
            Context::new().with_remote_span_context(parent)
        });
        let span = tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .start_with_context(tracer, &context);
        let root = span.span_context().clone();
        (Some(Self(root)), RootSpan(Some(span)))
    }

    /// Reads a stored trace (see [`JobTrace::to_fields`]).
    pub fn from_fields(traceparent: &str, tracestate: &str) -> Option<Self> {
        extract(Some(traceparent), Some(tracestate)).map(Self)
    }

    /// The `traceparent` and `tracestate` to store.
    pub fn to_fields(&self) -> (String, String) {
        let mut fields: HashMap<&str, String> = headers(&self.0).into_iter().collect();
        (
            fields
                .remove(names::headers::TRACEPARENT)
                .unwrap_or_default(),
            fields
                .remove(names::headers::TRACESTATE)
                .unwrap_or_default(),
        )
    }

    /// The trace id, 32 lowercase hex digits.
    pub fn trace_id(&self) -> String {
        self.0.trace_id().to_string()
    }

    /// Whether the job's spans are recorded: this process exports, and the
    /// job was sampled.
    pub fn records(&self) -> bool {
        enabled() && self.0.is_sampled()
    }

    /// The root span's context.
    pub fn root(&self) -> &SpanContext {
        &self.0
    }

    /// The context of the job's step `step` (`turn:3`, `call:<id>`): the same
    /// in every process and every run of the job.
    pub fn step(&self, step: &str) -> SpanContext {
        let mut hash = Sha256::new();
        hash.update(self.0.trace_id().to_bytes());
        hash.update(self.0.span_id().to_bytes());
        hash.update(step.as_bytes());
        let digest = hash.finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        // The all-zero id is invalid; one in 2^64, but never emit it.
        let id = if id == [0; 8] { [1; 8] } else { id };
        SpanContext::new(
            self.0.trace_id(),
            SpanId::from_bytes(id),
            self.0.trace_flags(),
            true,
            self.0.trace_state().clone(),
        )
    }
}

/// The root span of a job, open while the job is submitted.
#[derive(Debug)]
pub struct RootSpan(Option<opentelemetry_sdk::trace::Span>);

impl RootSpan {
    /// Sets an attribute.
    pub fn set(&mut self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new(key, value));
        }
    }

    /// Marks the submission failed.
    pub fn fail(&mut self, message: impl Into<Cow<'static, str>>) {
        if let Some(span) = &mut self.0 {
            span.set_status(Status::error(message));
        }
    }

    /// Ends the span (dropping it does too).
    pub fn end(self) {}
}

/// A span being recorded: plain data until [`StepSpan::end`] hands it to the
/// SDK. Dropped without `end`, it is never exported. Every method is a no-op
/// on a span that does not record (tracing off, or the job not sampled).
#[derive(Debug)]
#[must_use = "a span is exported only when it ends"]
pub struct StepSpan(Option<Box<Recording>>);

#[derive(Debug)]
struct Recording {
    name: Cow<'static, str>,
    kind: SpanKind,
    parent: SpanContext,
    /// The step's own id, or `None` for a random one.
    id: Option<SpanId>,
    started: SystemTime,
    attributes: Vec<KeyValue>,
    events: Vec<(&'static str, SystemTime)>,
    links: Vec<SpanContext>,
    status: Status,
}

impl StepSpan {
    /// A span that records nothing.
    pub const fn off() -> Self {
        Self(None)
    }

    /// Starts recording the span of the job's step `step`, a child of
    /// `parent` (the root when `None`, else another step).
    pub fn step(
        trace: Option<&JobTrace>,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        step: &str,
        parent: Option<&str>,
    ) -> Self {
        let Some(trace) = trace.filter(|t| t.records()) else {
            return Self::off();
        };
        let parent = parent.map_or_else(|| trace.0.clone(), |p| trace.step(p));
        Self::recording(name.into(), kind, parent, Some(trace.step(step).span_id()))
    }

    /// Starts recording a span with an id of its own under `parent` (a
    /// step's context, or one that came in headers), when `parent` is
    /// sampled and this process exports.
    pub fn child(
        parent: Option<&SpanContext>,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
    ) -> Self {
        match parent {
            Some(parent) if enabled() && parent.is_sampled() => {
                Self::recording(name.into(), kind, parent.clone(), None)
            }
            _ => Self::off(),
        }
    }

    fn recording(
        name: Cow<'static, str>,
        kind: SpanKind,
        parent: SpanContext,
        id: Option<SpanId>,
    ) -> Self {
        Self(Some(Box::new(Recording {
            name,
            kind,
            parent,
            id,
            started: SystemTime::now(),
            attributes: Vec::new(),
            events: Vec::new(),
            links: Vec::new(),
            status: Status::Unset,
        })))
    }

    /// Whether the span records (and its attributes are worth computing).
    pub fn is_recording(&self) -> bool {
        self.0.is_some()
    }

    /// Moves the start back (or on) to `started`.
    pub fn started_at(&mut self, started: SystemTime) {
        if let Some(r) = &mut self.0 {
            r.started = started;
        }
    }

    /// Sets an attribute.
    pub fn set(&mut self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        if let Some(r) = &mut self.0 {
            r.attributes.push(KeyValue::new(key, value));
        }
    }

    /// Sets an attribute whose value is a list of strings.
    pub fn set_strings(&mut self, key: &'static str, values: impl IntoIterator<Item = String>) {
        if let Some(r) = &mut self.0 {
            let values = values.into_iter().map(Into::into).collect();
            r.attributes.push(KeyValue::new(
                key,
                opentelemetry::Value::Array(opentelemetry::Array::String(values)),
            ));
        }
    }

    /// Marks a moment of the span (a phase done).
    pub fn event(&mut self, name: &'static str) {
        if let Some(r) = &mut self.0 {
            r.events.push((name, SystemTime::now()));
        }
    }

    /// Links the span to another (a resumed run to the run before it).
    pub fn link(&mut self, to: SpanContext) {
        if let Some(r) = &mut self.0 {
            r.links.push(to);
        }
    }

    /// Marks the span failed, with a message for the trace view.
    pub fn fail(&mut self, message: impl Into<Cow<'static, str>>) {
        if let Some(r) = &mut self.0 {
            r.status = Status::error(message);
        }
    }

    /// Records how a call ended: `toolfleet.outcome` (`ok` or the error
    /// code), and for a failure the code again as `error.type` (the
    /// OpenTelemetry convention), whether it may be retried, its side
    /// effect, and an error status.
    pub fn outcome(&mut self, envelope: &Envelope) {
        if !self.is_recording() {
            return;
        }
        match envelope.error() {
            None => self.set(span_attributes::OUTCOME, "ok"),
            Some(error) => {
                self.set(span_attributes::OUTCOME, error.code.as_str().to_owned());
                self.set(span_attributes::ERROR_TYPE, error.code.as_str().to_owned());
                self.set(span_attributes::RETRYABLE, error.retryable);
                if let Some(effect) = &error.side_effect {
                    self.set(span_attributes::SIDE_EFFECT, effect.clone());
                }
                self.fail(error.code.as_str().to_owned());
            }
        }
    }

    /// Ends the span now and hands it to the exporter.
    pub fn end(self) {
        self.end_after(None);
    }

    /// Ends the span `elapsed` after its start, or now.
    pub fn end_after(self, elapsed: Option<Duration>) {
        let (Some(r), Some(tracer)) = (self.0, TRACER.get()) else {
            return;
        };
        let ended = elapsed.map_or_else(SystemTime::now, |e| r.started + e);
        let builder = tracer
            .span_builder(r.name)
            .with_kind(r.kind)
            .with_start_time(r.started)
            .with_attributes(r.attributes)
            .with_links(r.links.into_iter().map(Link::with_context).collect());
        let context = Context::new().with_remote_span_context(r.parent);
        // Built on this thread right after the id is set: the generator
        // hands it to this span and no other.
        NEXT_SPAN_ID.with(|next| next.set(r.id));
        let mut span = builder.start_with_context(tracer, &context);
        NEXT_SPAN_ID.with(|next| next.set(None));
        span.set_status(r.status);
        for (name, at) in r.events {
            span.add_event_with_timestamp(name, at, Vec::new());
        }
        span.end_with_timestamp(ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace() -> JobTrace {
        JobTrace::from_fields(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "vendor=value",
        )
        .expect("a valid traceparent")
    }

    #[test]
    fn a_stored_trace_reads_back_as_it_was_written() {
        let (parent, state) = trace().to_fields();
        assert_eq!(
            parent,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        assert_eq!(state, "vendor=value");
        assert_eq!(trace().trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn malformed_trace_context_is_ignored() {
        for bad in [
            "",
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nx: y",
        ] {
            assert!(JobTrace::from_fields(bad, "").is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_step_has_the_same_span_in_every_process_and_its_own() {
        let job = trace();
        let turn = job.step("turn:1");
        assert_eq!(turn, trace().step("turn:1"));
        assert_ne!(turn.span_id(), job.step("turn:2").span_id());
        assert_ne!(turn.span_id(), job.root().span_id());
        assert_eq!(turn.trace_id(), job.root().trace_id());
        assert!(turn.is_sampled());
    }

    #[test]
    fn spans_of_a_process_that_does_not_export_record_nothing() {
        // No install in unit tests: nothing records, nothing panics.
        let mut span = StepSpan::step(Some(&trace()), "turn", SpanKind::Client, "turn:1", None);
        assert!(!span.is_recording());
        span.set("k", 1);
        span.end();
    }
}
