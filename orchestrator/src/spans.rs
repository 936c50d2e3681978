//! The spans of a job's steps, as the orchestrator records them: one owner
//! for their names, their step ids and their attributes (see
//! `toolfleet_service::traces` for why a step's span has an id of its own
//! and is recorded only when it ends).
//!
//! ```text
//! submit job                      (root, ended at submission; api/mod.rs)
//! ├─ start job / resume job       run:<epoch>, linked to the run before
//! ├─ chat <model>                 turn:<n> (the GenAI conventions' chat span)
//! │  └─ record_turn / finish      (a Redis commit)
//! └─ execute_tool <tool>          call:<wire id> (the conventions' execute_tool span)
//!    ├─ approval <tool>           approval:<wire id> (held to decided; api/decide.rs)
//!    ├─ attempt <n>               attempt:<wire id>:<n>
//!    │  ├─ record_dispatch
//!    │  └─ execute <tool>         (in the worker, from the call's headers)
//!    └─ record_call_result
//! ```

use toolfleet_proto::call::is_valid_call_id;
use toolfleet_proto::names::span_attributes;
use toolfleet_proto::{Envelope, EventId, WireId};
use toolfleet_service::traces::{SpanContext, SpanKind, StepSpan};

use crate::job::{JobId, JobSpec, JobTrace, ProviderKind};

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

/// The call a span is about: its tool, its wire id (which names its steps,
/// and is never an attribute: it is the job's secret), the id its events
/// show, the model's own id and the arguments as the model wrote them.
#[derive(Clone, Copy)]
pub(crate) struct CallRef<'a> {
    pub(crate) tool: &'a str,
    pub(crate) wire_id: &'a WireId,
    pub(crate) event_id: &'a EventId,
    pub(crate) call_id: &'a str,
    pub(crate) arguments: &'a str,
}

/// Whether a call's span carries what the call said and answered
/// (`telemetry.capture_tool_content`): its arguments and its result, each
/// cut to [`MAX_CAPTURED_BYTES`]. Omitted unless configured, as the GenAI
/// conventions ask of content that may be large or sensitive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum ToolContent {
    /// Neither arguments nor results go on spans.
    #[default]
    Omitted,
    /// The arguments and a successful result go on the call's span.
    Captured,
}

impl ToolContent {
    /// The setting `telemetry.capture_tool_content` says.
    pub(crate) fn from_setting(capture: bool) -> Self {
        if capture {
            Self::Captured
        } else {
            Self::Omitted
        }
    }
}

/// The most bytes of a call's arguments, or of its result, that go on its
/// span; more is cut at a character boundary and marked.
pub(crate) const MAX_CAPTURED_BYTES: usize = 8 * 1024;

/// `text`, or its first [`MAX_CAPTURED_BYTES`] at most, cut on a character
/// boundary and marked with its whole size.
fn bounded(text: &str) -> String {
    if text.len() <= MAX_CAPTURED_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_CAPTURED_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[cut: {} bytes in all]", &text[..end], text.len())
}

/// The GenAI conventions' operation of a model turn.
const CHAT: &str = "chat";
/// The GenAI conventions' operation of a tool call.
const EXECUTE_TOOL: &str = "execute_tool";
/// Every tool is a function to the model: the model writes its arguments,
/// the fleet runs it.
const FUNCTION: &str = "function";

/// The GenAI conventions' name of the provider behind `provider`
/// (`gen_ai.provider.name`), and the OpenAI API it speaks
/// (`openai.api.type`), if any; `None` for a call job, which asks no model.
/// An OpenAI-compatible server is `openai`, as the conventions say: the
/// model names tell it apart.
fn provider_name(provider: &ProviderKind) -> Option<(&'static str, Option<&'static str>)> {
    match provider {
        ProviderKind::OpenaiResponses => Some(("openai", Some("responses"))),
        ProviderKind::OpenaiChat => Some(("openai", Some("chat_completions"))),
        ProviderKind::AnthropicMessages => Some(("anthropic", None)),
        ProviderKind::Scripted => Some(("toolfleet.scripted", None)),
        ProviderKind::Call => None,
    }
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

/// The span of model turn `turn` (counted from 1): the GenAI conventions'
/// chat span, `chat <model>` (`chat` for a job that names no model), with
/// the request's attributes (what the
/// answer says is set by the turn). A call job's turn asks no model: it is
/// `model turn`, with toolfleet's attributes only.
pub(crate) fn turn(trace: Option<&JobTrace>, turn: u32, spec: &JobSpec) -> StepSpan {
    let Some(trace) = recorded(trace) else {
        return StepSpan::off();
    };
    let step = Step::Turn(turn).name();
    let provider = provider_name(&spec.provider);
    let name = match provider {
        // The model's name when the job gives one (the scripted model may
        // have none).
        Some(_) if spec.model.is_empty() => CHAT.to_owned(),
        Some(_) => format!("{CHAT} {}", spec.model),
        None => "model turn".to_owned(),
    };
    let mut span = StepSpan::step(Some(trace), name, SpanKind::Client, &step, None);
    if let Some((provider_name, api_type)) = provider {
        span.set(span_attributes::GEN_AI_OPERATION_NAME, CHAT);
        span.set(span_attributes::GEN_AI_PROVIDER_NAME, provider_name);
        if !spec.model.is_empty() {
            span.set(span_attributes::GEN_AI_REQUEST_MODEL, spec.model.clone());
        }
        if let Some(max_tokens) = spec.max_tokens {
            span.set(
                span_attributes::GEN_AI_REQUEST_MAX_TOKENS,
                i64::from(max_tokens),
            );
        }
        if spec.stream {
            span.set(span_attributes::GEN_AI_REQUEST_STREAM, true);
        }
        if let Some(api_type) = api_type {
            span.set(span_attributes::OPENAI_API_TYPE, api_type);
        }
    }
    span.set(span_attributes::PROVIDER, spec.provider.as_str());
    span.set(span_attributes::TURN, i64::from(turn));
    span
}

/// The span of a call, across its attempts: the GenAI conventions'
/// execute_tool span, `execute_tool <tool>`, with the model's id of the
/// call when it is a safe one, and its arguments when `content` says.
pub(crate) fn call(trace: Option<&JobTrace>, call: CallRef<'_>, content: ToolContent) -> StepSpan {
    let Some(trace) = recorded(trace) else {
        return StepSpan::off();
    };
    let name = format!("{EXECUTE_TOOL} {}", call.tool);
    let step = Step::Call(call.wire_id).name();
    let mut span = StepSpan::step(Some(trace), name, SpanKind::Internal, &step, None);
    span.set(span_attributes::GEN_AI_OPERATION_NAME, EXECUTE_TOOL);
    span.set(span_attributes::GEN_AI_TOOL_NAME, call.tool.to_owned());
    span.set(span_attributes::GEN_AI_TOOL_TYPE, FUNCTION);
    // The model's words: on a span only when they are a plain id, as on
    // the wire (`Toolfleet-Model-Call-Id`).
    if is_valid_call_id(call.call_id) {
        span.set(
            span_attributes::GEN_AI_TOOL_CALL_ID,
            call.call_id.to_owned(),
        );
    }
    span.set(span_attributes::TOOL, call.tool.to_owned());
    span.set(span_attributes::CALL_ID, call.event_id.to_string());
    if content == ToolContent::Captured {
        span.set(
            span_attributes::GEN_AI_TOOL_CALL_ARGUMENTS,
            bounded(call.arguments),
        );
    }
    span
}

/// Records on a call's span how the call ended: its outcome (with
/// `error.type`, the envelope's code, when it failed) and, when `content`
/// says, the data of a successful envelope.
pub(crate) fn settle_call(span: &mut StepSpan, envelope: &Envelope, content: ToolContent) {
    span.outcome(envelope);
    if content == ToolContent::Captured
        && span.is_recording()
        && let Envelope::Ok(data) = envelope
    {
        span.set(
            span_attributes::GEN_AI_TOOL_CALL_RESULT,
            bounded(&data.to_string()),
        );
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captured_content_is_bounded_on_a_character_boundary() {
        assert_eq!(bounded(r#"{"x":1}"#), r#"{"x":1}"#);
        let exact = "a".repeat(MAX_CAPTURED_BYTES);
        assert_eq!(bounded(&exact), exact);
        // A two-byte character across the bound is left out whole.
        let text = format!("{}é and more", "a".repeat(MAX_CAPTURED_BYTES - 1));
        let cut = bounded(&text);
        assert!(
            cut.starts_with(&"a".repeat(MAX_CAPTURED_BYTES - 1)),
            "{cut}"
        );
        assert!(
            cut.ends_with(&format!("…[cut: {} bytes in all]", text.len())),
            "{cut}"
        );
        assert!(!cut.contains('é'));
    }

    #[test]
    fn every_provider_has_its_conventions_name() {
        let names: Vec<_> = ProviderKind::ALL.iter().map(provider_name).collect();
        assert_eq!(
            names,
            [
                Some(("toolfleet.scripted", None)),
                Some(("openai", Some("responses"))),
                Some(("openai", Some("chat_completions"))),
                Some(("anthropic", None)),
            ]
        );
        assert_eq!(provider_name(&ProviderKind::Call), None);
    }
}
