//! The spans of a job's steps, as the orchestrator records them: one owner
//! for their names, their step ids and their attributes (see
//! `toolfleet_service::traces` for why a step's span has an id of its own
//! and is recorded only when it ends).
//!
//! ```text
//! submit job                      (root, ended at submission; api/mod.rs)
//! ├─ start job / resume job       run:<epoch>, linked to the run before
//! ├─ model turn                   turn:<n>
//! │  └─ record_turn / finish      (a Redis commit)
//! └─ tool call <tool>             call:<wire id>
//!    ├─ approval <tool>           approval:<wire id> (held to decided; api/decide.rs)
//!    ├─ attempt <n>               attempt:<wire id>:<n>
//!    │  ├─ record_dispatch
//!    │  └─ execute <tool>         (in the worker, from the call's headers)
//!    └─ record_call_result
//! ```

use toolfleet_proto::names::span_attributes;
use toolfleet_proto::{EventId, WireId};
use toolfleet_service::traces::{SpanContext, SpanKind, StepSpan};

use crate::job::{JobId, JobSpec, JobTrace};

/// A step of a job, which names its span (and so its span's id). Spelled
/// out only for a job that is traced here: building names for spans that
/// record nothing showed in the orchestrator's profile.
#[derive(Clone, Copy)]
pub(crate) enum Step<'a> {
    /// Model turn n (from 1).
    Turn(u32),
    /// A call, by wire id, across its attempts.
    Call(&'a WireId),
    /// An attempt of a call.
    Attempt(&'a WireId, u32),
    /// A call's wait for a person's decision.
    Approval(&'a WireId),
}

impl Step<'_> {
    fn name(self) -> String {
        match self {
            Self::Turn(turn) => format!("turn:{turn}"),
            Self::Call(wire_id) => format!("call:{wire_id}"),
            Self::Attempt(wire_id, attempt) => format!("attempt:{wire_id}:{attempt}"),
            Self::Approval(wire_id) => format!("approval:{wire_id}"),
        }
    }
}

/// The trace, if this process records the job's spans.
fn recorded(trace: Option<&JobTrace>) -> Option<&JobTrace> {
    trace.filter(|t| t.records())
}

/// The call a span is about: its tool, its wire id (which names its steps)
/// and the id its events show.
#[derive(Clone, Copy)]
pub(crate) struct CallRef<'a> {
    pub(crate) tool: &'a str,
    pub(crate) wire_id: &'a WireId,
    pub(crate) event_id: &'a EventId,
}

/// The span of a run of the job: its start, or its resumption by replica
/// `owner` after another stopped, linked to the run before it.
pub(crate) fn run(
    trace: Option<&JobTrace>,
    job_id: &JobId,
    epoch: u64,
    owner: &str,
    resumed: bool,
) -> StepSpan {
    let name = if resumed { "resume job" } else { "start job" };
    let mut span = StepSpan::step(
        trace,
        name,
        SpanKind::Internal,
        &format!("run:{epoch}"),
        None,
    );
    if let Some(trace) = trace.filter(|_| span.is_recording()) {
        span.set(span_attributes::JOB_ID, job_id.to_string());
        span.set(span_attributes::EPOCH, epoch_value(epoch));
        span.set(span_attributes::REPLICA, owner.to_owned());
        span.set(span_attributes::RESUMED, resumed);
        if epoch > 1 {
            span.link(trace.step(&format!("run:{}", epoch - 1)));
        }
    }
    span
}

/// The span of model turn `turn` (counted from 1).
pub(crate) fn turn(trace: Option<&JobTrace>, turn: u32, spec: &JobSpec) -> StepSpan {
    let Some(trace) = recorded(trace) else {
        return StepSpan::off();
    };
    let step = Step::Turn(turn).name();
    let mut span = StepSpan::step(Some(trace), "model turn", SpanKind::Client, &step, None);
    span.set(span_attributes::GEN_AI_SYSTEM, spec.provider.as_str());
    span.set(span_attributes::GEN_AI_REQUEST_MODEL, spec.model.clone());
    span.set(span_attributes::TURN, i64::from(turn));
    span
}

/// The span of a call, across its attempts.
pub(crate) fn call(trace: Option<&JobTrace>, call: CallRef<'_>) -> StepSpan {
    let Some(trace) = recorded(trace) else {
        return StepSpan::off();
    };
    let name = format!("tool call {}", call.tool);
    let step = Step::Call(call.wire_id).name();
    let mut span = StepSpan::step(Some(trace), name, SpanKind::Internal, &step, None);
    span.set(span_attributes::TOOL, call.tool.to_owned());
    span.set(span_attributes::CALL_ID, call.event_id.to_string());
    span
}

/// The span of a held call's wait for a person's decision, under its
/// call's span; the caller sets when it began (the call was held).
pub(crate) fn approval(trace: Option<&JobTrace>, call: CallRef<'_>) -> StepSpan {
    let Some(trace) = recorded(trace) else {
        return StepSpan::off();
    };
    let mut span = StepSpan::step(
        Some(trace),
        format!("approval {}", call.tool),
        SpanKind::Internal,
        &Step::Approval(call.wire_id).name(),
        Some(&Step::Call(call.wire_id).name()),
    );
    span.set(span_attributes::TOOL, call.tool.to_owned());
    span.set(span_attributes::CALL_ID, call.event_id.to_string());
    span
}

/// The span of one attempt of a call; `resumed` when a runner picks up an
/// attempt another one dispatched.
pub(crate) fn attempt(
    trace: Option<&JobTrace>,
    call: CallRef<'_>,
    attempt: u32,
    resumed: bool,
) -> StepSpan {
    let Some(trace) = recorded(trace) else {
        return StepSpan::off();
    };
    let mut span = StepSpan::step(
        Some(trace),
        format!("attempt {attempt}"),
        SpanKind::Producer,
        &Step::Attempt(call.wire_id, attempt).name(),
        Some(&Step::Call(call.wire_id).name()),
    );
    span.set(span_attributes::TOOL, call.tool.to_owned());
    span.set(span_attributes::ATTEMPT, i64::from(attempt));
    span.set(span_attributes::RESUMED, resumed);
    span.set(span_attributes::MESSAGING_SYSTEM, "nats");
    span
}

/// The span of the Redis commit `verb` (`record_turn`) made for the step
/// `parent`.
pub(crate) fn commit(trace: Option<&JobTrace>, parent: Step<'_>, verb: &'static str) -> StepSpan {
    let Some(trace) = recorded(trace) else {
        return StepSpan::off();
    };
    let parent = trace.step(&parent.name());
    let mut span = StepSpan::child(Some(&parent), verb, SpanKind::Client);
    span.set(span_attributes::DB_SYSTEM, "redis");
    span.set(span_attributes::DB_OPERATION, verb);
    span
}

/// The trace context a worker gets with an attempt: the attempt's span when
/// the job is recorded here, else the job's own context (the client's, with
/// tracing off), so that the worker's logs still carry the trace id.
pub(crate) fn attempt_context(
    trace: Option<&JobTrace>,
    wire_id: &WireId,
    attempt: u32,
) -> Option<SpanContext> {
    let trace = trace?;
    Some(if trace.records() {
        trace.step(&Step::Attempt(wire_id, attempt).name())
    } else {
        trace.root().clone()
    })
}

fn epoch_value(epoch: u64) -> i64 {
    i64::try_from(epoch).unwrap_or(i64::MAX)
}
