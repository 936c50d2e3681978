//! The life of one delivered call, in four steps after a first check:
//!
//! 0. [`own`]: is the call this worker's (its tool served, the subject and
//!    the queue it came from that tool's)? If not, its message is terminated
//!    unanswered, before the ledger is touched. Then [`pin`]: a call pinned
//!    to another version of the tool is handed back, unclaimed, for a
//!    worker of its version.
//! 1. [`claim`]: claim the attempt in the Redis ledger. A stored result is
//!    answered again, a live claim elsewhere is handed back for later, and a
//!    delivery past `runtime.max_deliveries` is answered without running.
//!    The first delivery of a read-only call takes no claim: it runs, and
//!    settles by storing its result unless one is (decision 0060).
//! 2. [`check`]: the pure checks of the call against the loaded tool
//!    (deadline, argument size, JSON Schema).
//! 3. [`run`]: ask the probe first when a side effect may already have
//!    happened, then execute the tool with its timeout, catching panics, until
//!    the drain abandons it.
//! 4. [`settle`]: store the envelope, publish the reply, and ack the message
//!    as [`settle::ack_for`] decides.
//!
//! The claim comes before the checks on purpose: the deadline check depends
//! on the clock, and a redelivery that arrives after the deadline while the
//! first delivery still runs must wait for its result, not store a
//! `DEADLINE_EXCEEDED` over an effect that is happening.

mod check;
mod claim;
mod own;
mod pin;
mod run;
mod settle;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_nats::jetstream::Message;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::names::{self, span_attributes};
use toolfleet_proto::{Envelope, ToolCall};
use toolfleet_service::traces::{self, SpanContext, SpanKind, StepSpan};
use tracing::{Instrument, debug, error, info_span, warn};

use crate::config::RuntimeOptions;
use crate::ledger::{Ledger, Owner};
use crate::metrics;
pub(crate) use crate::tool_set::LoadedTool;
use crate::tool_set::ToolSet;
use run::Ran;
use settle::Outcome;

/// Executes deliveries; shared by all pull loops of a process.
pub(crate) struct Executor {
    pub(crate) tools: ToolSet,
    pub(crate) ledger: Ledger,
    pub(crate) nats: async_nats::Client,
    pub(crate) options: RuntimeOptions,
    pub(crate) worker_id: String,
    /// Cancelled when the drain timeout ran out: running calls are abandoned
    /// and handed back.
    pub(crate) abandon: CancellationToken,
}

impl Executor {
    /// Handles one delivery to the end, including its ack. Never panics on
    /// bad input: every outcome is an envelope or an ack decision.
    pub(crate) async fn handle(self: Arc<Self>, tool: String, message: Message) {
        metrics::in_flight(1.0);
        if let Err(unreadable) = pin::readable(&message) {
            // Nothing of it is read: a newer worker takes it.
            error!(tool, error = %unreadable, "a call this worker cannot read handed back");
            metrics::call_handed_back(&tool, pin::NEWER_FORMAT);
            settle::acknowledge(&message, Outcome::Retry(pin::NEWER_FORMAT_WAIT)).await;
            metrics::in_flight(-1.0);
            return;
        }
        let outcome = match decode(&message) {
            Ok(call) => {
                if message.info().is_ok_and(|info| info.delivered > 1) {
                    metrics::redelivered(&call.tool);
                }
                let parent = trace_context(&message);
                let trace_id = parent.as_ref().map(|p| p.trace_id().to_string());
                let log = info_span!("call", job_id = %call.job_id, call_id = %call.call_id,
                                     tool = %call.tool, attempt = call.attempt, trace_id);
                let mut span = execution_span(parent.as_ref(), &call, &message);
                let outcome = self
                    .process(&tool, &call, &message, &mut span)
                    .instrument(log)
                    .await;
                span.end();
                outcome
            }
            Err(reason) => {
                metrics::call_rejected(reason);
                Outcome::Rejected
            }
        };
        settle::acknowledge(&message, outcome).await;
        metrics::in_flight(-1.0);
    }

    /// The steps for a decoded call, pulled from `pulled`'s queue; returns
    /// how the delivery ended. `span` gets an event as each step ends.
    async fn process(
        &self,
        pulled: &str,
        call: &ToolCall,
        message: &Message,
        span: &mut StepSpan,
    ) -> Outcome {
        let Some(tool) = own::own(&self.tools, pulled, &message.subject, call) else {
            error!(
                subject = excerpt(&message.subject, 128),
                pulled, "call for a tool this worker does not serve here dropped unanswered"
            );
            metrics::call_rejected(own::NOT_OURS);
            return Outcome::Rejected;
        };
        if is_cancel(message) {
            return self.mark_cancelled(call).await;
        }
        if let Some(delay) = pin::hand_back(&tool, message) {
            return self.pinned_elsewhere(call, message, delay, span).await;
        }
        let (owner, earlier) = match self.take(&tool, call, message, span).await {
            Ok(taken) => taken,
            Err(ended) => return ended,
        };
        let started = Instant::now();
        if pin::is_version_gone(message) {
            // An execution that began (a side effect's marker, or a task
            // it saved to resume) may have done its effect.
            let began = earlier.started || earlier.checkpoint.is_some();
            let gone = pin::version_gone(&call.tool, began);
            return self
                .finished(call, (&owner, None), &gone, started, span)
                .await;
        }
        // The checks never await, so only `run` has to watch the abandon token.
        let checked = check::check(
            &tool,
            call,
            self.options.max_argument_bytes,
            SystemTime::now(),
        );
        span.event("checked");
        let envelope = match checked {
            Err(envelope) => envelope,
            Ok(checked) => match self.run(checked, call, message, &owner, earlier).await {
                Ran::Finished(envelope) => envelope,
                Ran::Abandoned => {
                    span.set(span_attributes::HANDED_BACK, true);
                    return self.hand_back(call, &owner, Duration::ZERO).await;
                }
                // Not at once: what the probe asks is down for a moment,
                // or another delivery has the call.
                Ran::AskLater | Ran::ClaimLost => {
                    span.set(span_attributes::HANDED_BACK, true);
                    return self.hand_back(call, &owner, Duration::from_secs(1)).await;
                }
            },
        };
        let ran_on = Some(tool.contract.as_str());
        self.finished(call, (&owner, ran_on), &envelope, started, span)
            .await
    }

    /// A call that ran (or failed its checks) since `started`, as `owner`,
    /// on the version of its tool `ran_on` (`None`: it did not run on any):
    /// its span and metrics say how, and its envelope is stored and
    /// answered.
    async fn finished(
        &self,
        call: &ToolCall,
        (owner, ran_on): (&Owner, Option<&str>),
        envelope: &Envelope,
        started: Instant,
        span: &mut StepSpan,
    ) -> Outcome {
        let elapsed = started.elapsed();
        span.event("ran");
        span.set(span_attributes::RUN_MS, elapsed.as_secs_f64() * 1e3);
        span.outcome(envelope);
        metrics::call_finished(&call.tool, envelope, elapsed);
        debug!(
            ok = envelope.is_ok(),
            elapsed_ms = elapsed.as_millis() as u64,
            "call finished"
        );
        let settled = self.settle(call, owner, envelope, (elapsed, ran_on)).await;
        span.event("stored");
        settled
    }
}

impl Executor {
    /// A delivery of `call` pinned to a version of its tool this worker
    /// does not run: handed back to wait `delay`, unless the ledger, asked
    /// after a few deliveries, says it was answered meanwhile (it is then
    /// dropped: whoever answered it replied).
    async fn pinned_elsewhere(
        &self,
        call: &ToolCall,
        message: &Message,
        delay: Duration,
        span: &mut StepSpan,
    ) -> Outcome {
        if pin::ask_ledger(message) && self.ledger.has_result(call).await.unwrap_or(false) {
            debug!("a call pinned to another version was answered meanwhile; dropped");
            return Outcome::Answered;
        }
        debug!("call pinned to another version of the tool handed back");
        metrics::call_handed_back(&call.tool, pin::OTHER_VERSION);
        span.set(span_attributes::HANDED_BACK, true);
        Outcome::Retry(delay)
    }

    /// A cancel of `call` (its job was cancelled): marked in the ledger,
    /// where the execution that holds the call finds it at its next
    /// renewal, and one yet to run it at its claim (decision 0044).
    async fn mark_cancelled(&self, call: &ToolCall) -> Outcome {
        match self.ledger.cancel(call).await {
            Ok(()) => {
                debug!("the call's job was cancelled; marked in the ledger");
                Outcome::Answered
            }
            Err(err) => {
                warn!(error = %err, "redis unavailable; the call's cancel is handed back");
                Outcome::Retry(Duration::from_secs(1))
            }
        }
    }
}

/// Whether `message` cancels the call it carries rather than asks for it.
fn is_cancel(message: &Message) -> bool {
    message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(names::headers::CANCEL))
        .is_some_and(|value| value.as_str() == "1")
}

/// The trace context the orchestrator sent with the call, if valid.
fn trace_context(message: &Message) -> Option<SpanContext> {
    let headers = message.headers.as_ref()?;
    let header = |name: &str| headers.get(name).map(|v| v.as_str());
    traces::extract(
        header(names::headers::TRACEPARENT),
        header(names::headers::TRACESTATE),
    )
}

/// The span of this delivery's execution, a child of the attempt that sent
/// it. One span with an event per step, not a span per step: a worker
/// killed mid-call would leave the steps it finished without their parent.
/// It names the tool and the model's id of the call in the GenAI
/// conventions' words too, but it is not their `execute_tool` span: that
/// is the orchestrator's call span, one per call across its attempts and
/// deliveries.
fn execution_span(parent: Option<&SpanContext>, call: &ToolCall, message: &Message) -> StepSpan {
    let mut span = StepSpan::child(parent, format!("execute {}", call.tool), SpanKind::Consumer);
    if span.is_recording() {
        span.set(span_attributes::TOOL, call.tool.clone());
        span.set(span_attributes::GEN_AI_TOOL_NAME, call.tool.clone());
        if let Some(id) = run::model_call_id(message.headers.as_ref()) {
            span.set(span_attributes::GEN_AI_TOOL_CALL_ID, id);
        }
        span.set(span_attributes::ATTEMPT, i64::from(call.attempt));
        span.set(span_attributes::MESSAGING_SYSTEM, "nats");
        if let Ok(info) = message.info() {
            span.set(span_attributes::DELIVERY, info.delivered);
            let waited = time::OffsetDateTime::now_utc() - info.published;
            span.set(
                span_attributes::QUEUE_WAIT_MS,
                waited.as_seconds_f64().max(0.0) * 1e3,
            );
        }
    }
    span
}

/// The call a message carries, if it is one the orchestrator sends; else
/// why not (the metric's `reason`), logged. Its fields become keys, headers
/// and subjects, so a call that fails [`ToolCall::check`] is never run.
fn decode(message: &Message) -> Result<ToolCall, &'static str> {
    let call = serde_json::from_slice::<ToolCall>(&message.payload).map_err(|err| {
        error!(subject = %message.subject, error = %err, "undecodable call message dropped");
        "undecodable"
    })?;
    call.check().map_err(|invalid| {
        error!(
            subject = %message.subject,
            job_id = excerpt(&call.job_id, 64),
            call_id = excerpt(&call.call_id, 64),
            error = %invalid,
            "invalid call message dropped"
        );
        invalid.0
    })?;
    Ok(call)
}
