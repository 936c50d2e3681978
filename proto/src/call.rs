//! The tool call: what the orchestrator publishes to `toolfleet.call.<tool>`.

use serde::{Deserialize, Serialize};

/// One attempt of one function call the model made, as it travels over NATS.
///
/// `(job_id, call_id, attempt)` identifies an execution: a worker that receives
/// the same triple twice answers from the stored result instead of running the
/// tool again. `idempotency_key` stays the same across attempts of a call, so a
/// side-effecting tool can pass it to the system it changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The job this call belongs to.
    pub job_id: String,
    /// The call's id in the fleet (its wire id: `c` and 24 hex digits, made
    /// by the orchestrator from a secret of the job and the call's position;
    /// for a job stored before those secrets, the model's id when safe, else
    /// `x.<position>`), unique within the job; read as a [`WireId`]. Not the
    /// model's own id, which is the model's words: that travels only in the
    /// [`MODEL_CALL_ID`](crate::names::headers::MODEL_CALL_ID) header, and
    /// only when it is a safe one.
    pub call_id: String,
    /// 1 for the first attempt, incremented by each retry of the orchestrator.
    pub attempt: u32,
    /// Tool name; must match the subject the call was published to.
    pub tool: String,
    /// The arguments exactly as the model produced them: a JSON text that may be
    /// malformed, which is why it is not parsed here.
    pub arguments: String,
    /// Unix epoch milliseconds after which the result is useless and the call
    /// must not start. `None`: no deadline beyond the tool's own timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Stable across attempts of this call.
    pub idempotency_key: String,
    /// Core NATS subject the envelope is published to. `None`: the result is only
    /// stored in Redis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
}

/// Longest call id used as it is on the wire.
pub const MAX_CALL_ID_LEN: usize = 64;

/// Whether a call id can go on the wire as it is: 1 to 64 ASCII letters,
/// digits, `_` and `-` (what OpenAI and compatible servers generate). It
/// becomes part of NATS headers, message ids (`job:call:attempt`, hence no
/// `:`) and Redis keys, so nothing else may.
pub fn is_valid_call_id(id: &str) -> bool {
    (1..=MAX_CALL_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `id` is a call id the orchestrator puts on the wire: a safe call
/// id ([`is_valid_call_id`]), or `x.<n>` (the position of a call whose own
/// id was not safe, or a duplicate).
pub fn is_valid_wire_id(id: &str) -> bool {
    is_valid_call_id(id)
        || id
            .strip_prefix("x.")
            .is_some_and(|n| (1..=10).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A call's id in the fleet, checked ([`is_valid_wire_id`]): what NATS
/// headers, message ids, the ledger's and the attempts' Redis keys and a
/// hold's key name the call by. The orchestrator makes it (from a secret of
/// the job and the call's position; for a job stored before those secrets,
/// the call's [`EventId`]); it is read by [`WireId::parse`] where one comes
/// in (an operator's decision, a stored record) and passed as this type from
/// there on. [`ToolCall::call_id`] carries it as text, checked by
/// [`ToolCall::check`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WireId(String);

impl WireId {
    /// Reads `id`; `None` when it is not a wire id.
    pub fn parse(id: &str) -> Option<Self> {
        is_valid_wire_id(id).then(|| Self(id.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

crate::id::checked_id!(
    WireId,
    is_valid_wire_id,
    "not a call's wire id (1 to 64 ASCII letters, digits, _ and -, or x.<position>)"
);

/// The id a job's events show a call by, checked: the model's id when it
/// is a safe one ([`is_valid_call_id`]) and the first with that id in the
/// job, else `x.<position>`. Safe to print, and what a client can match
/// with its conversation. Made by [`EventId::of`], read by
/// [`EventId::parse`] from a stored record.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);

impl EventId {
    /// The event id of the call at `position` in the conversation, whose
    /// model id is `model_id`; `duplicate` when an earlier call had that id.
    pub fn of(position: usize, model_id: &str, duplicate: bool) -> Self {
        if !duplicate && is_valid_call_id(model_id) {
            Self(model_id.to_owned())
        } else {
            Self(format!("x.{position}"))
        }
    }

    /// Reads `id`; `None` when it is not an event id.
    pub fn parse(id: &str) -> Option<Self> {
        is_valid_wire_id(id).then(|| Self(id.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

crate::id::checked_id!(
    EventId,
    is_valid_wire_id,
    "not a call's event id (1 to 64 ASCII letters, digits, _ and -, or x.<position>)"
);

/// A job stored before call secrets names its calls on the wire as its
/// events do.
impl From<EventId> for WireId {
    fn from(id: EventId) -> Self {
        Self(id.0)
    }
}

/// Longest idempotency key a call may carry.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 256;

/// The field of a [`ToolCall`] that is not what the orchestrator sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the call's {0} is not one the orchestrator sends")]
pub struct InvalidCall(pub &'static str);

impl ToolCall {
    /// Checks every field that becomes a key, a header or a subject, as the
    /// orchestrator makes them: the job id ([`JobId`](crate::job::JobId)),
    /// the wire call id, the tool name, the attempt (from 1), the
    /// idempotency key (printable ASCII, at most 256 bytes) and the reply
    /// subject (the job's own, or none). A call from the bus that fails is
    /// someone else's message, never executed.
    ///
    /// # Errors
    ///
    /// [`InvalidCall`] naming the first field that fails.
    pub fn check(&self) -> Result<(), InvalidCall> {
        let Some(job_id) = crate::job::JobId::parse(&self.job_id) else {
            return Err(InvalidCall("job_id"));
        };
        if !is_valid_wire_id(&self.call_id) {
            return Err(InvalidCall("call_id"));
        }
        if !crate::manifest::is_valid_tool_name(&self.tool) {
            return Err(InvalidCall("tool"));
        }
        if self.attempt == 0 {
            return Err(InvalidCall("attempt"));
        }
        if !(1..=MAX_IDEMPOTENCY_KEY_LEN).contains(&self.idempotency_key.len())
            || !self.idempotency_key.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(InvalidCall("idempotency_key"));
        }
        if self
            .reply_to
            .as_ref()
            .is_some_and(|subject| *subject != crate::names::reply_subject(&job_id))
        {
            return Err(InvalidCall("reply_to"));
        }
        Ok(())
    }

    /// The default idempotency key of a call: the same for every attempt.
    pub fn default_idempotency_key(job_id: &str, call_id: &str) -> String {
        format!("{job_id}:{call_id}")
    }

    /// The JetStream message id of this attempt, for the stream's dedup window.
    pub fn msg_id(&self) -> String {
        format!("{}:{}:{}", self.job_id, self.call_id, self.attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_call_survives_json(
            job_id in "[a-z0-9]{1,26}",
            call_id in "\\PC{1,40}",
            attempt in 1u32..100,
            tool in "[a-zA-Z0-9_-]{1,64}",
            arguments in "\\PC{0,200}",
            deadline_ms in proptest::option::of(any::<u64>()),
            reply_to in proptest::option::of("[a-z.]{1,30}"),
        ) {
            let call = ToolCall {
                idempotency_key: ToolCall::default_idempotency_key(&job_id, &call_id),
                job_id, call_id, attempt, tool, arguments, deadline_ms, reply_to,
            };
            let json = serde_json::to_vec(&call).unwrap();
            let back: ToolCall = serde_json::from_slice(&json).unwrap();
            prop_assert_eq!(back, call);
        }
    }

    fn valid_call() -> ToolCall {
        let job_id = "acme-0190000000010000000000001234".to_owned();
        ToolCall {
            idempotency_key: ToolCall::default_idempotency_key(&job_id, "x.12"),
            reply_to: Some(crate::names::reply_subject(
                &crate::job::JobId::parse(&job_id).unwrap(),
            )),
            job_id,
            call_id: "x.12".into(),
            attempt: 1,
            tool: "calculate".into(),
            arguments: "{".into(),
            deadline_ms: None,
        }
    }

    /// A field's name, and how to spoil it.
    type Spoil = (&'static str, fn(&mut ToolCall));

    #[test]
    fn a_call_is_checked_field_by_field() {
        assert_eq!(valid_call().check(), Ok(()));
        let cases: [Spoil; 9] = [
            ("job_id", |c| c.job_id = "j\nx".into()),
            ("job_id", |c| {
                c.job_id = "0190000000010000000000001234\r\n".into()
            }),
            ("call_id", |c| c.call_id = "call\n1".into()),
            ("call_id", |c| c.call_id = "x.".into()),
            ("tool", |c| c.tool = "a.b".into()),
            ("attempt", |c| c.attempt = 0),
            ("idempotency_key", |c| c.idempotency_key = "a b".into()),
            ("idempotency_key", |c| c.idempotency_key = "k".repeat(257)),
            ("reply_to", |c| {
                let other = crate::job::JobId::new("acme", 2, 3);
                c.reply_to = Some(crate::names::reply_subject(&other));
            }),
        ];
        for (field, spoil) in cases {
            let mut call = valid_call();
            spoil(&mut call);
            assert_eq!(call.check(), Err(InvalidCall(field)), "{call:?}");
        }
        let mut no_reply = valid_call();
        no_reply.reply_to = None;
        assert_eq!(no_reply.check(), Ok(()));
        for wire in ["call_abc", "x.0", "x.4294967295"] {
            assert!(is_valid_wire_id(wire), "{wire}");
        }
        for not_wire in ["x.1.2", "x.-1", "x.12345678901", "y.1", ""] {
            assert!(!is_valid_wire_id(not_wire), "{not_wire}");
        }
    }

    #[test]
    fn a_call_s_ids_are_read_only_in_their_form_and_travel_as_their_text() {
        let wire = WireId::parse("c0123456789abcdef01234567").expect("a wire id");
        assert_eq!(wire, "c0123456789abcdef01234567");
        assert_eq!(
            serde_json::to_string(&wire).unwrap(),
            "\"c0123456789abcdef01234567\""
        );
        assert_eq!(serde_json::from_str::<WireId>("\"x.3\"").unwrap(), "x.3");
        for not_an_id in ["", "a:b", "a b", "x.", "é"] {
            assert_eq!(WireId::parse(not_an_id), None, "{not_an_id:?}");
            assert_eq!(EventId::parse(not_an_id), None, "{not_an_id:?}");
            let json = serde_json::to_string(not_an_id).unwrap();
            assert!(serde_json::from_str::<WireId>(&json).is_err(), "{json}");
            assert!(serde_json::from_str::<EventId>(&json).is_err(), "{json}");
        }
        // Events show the model's id where it is safe and the first such,
        // else the call's position.
        let cases = [
            ((2, "call_a", false), "call_a"),
            ((3, "call_a", true), "x.3"),
            ((4, "bad id", false), "x.4"),
            ((5, "", false), "x.5"),
            ((6, &"a".repeat(65), false), "x.6"),
        ];
        for ((position, model_id, duplicate), shown) in cases {
            let event = EventId::of(position, model_id, duplicate);
            assert_eq!(event, shown, "{model_id:?}");
            // A job before call secrets names its calls on the wire so.
            assert_eq!(WireId::from(event), shown);
        }
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<ToolCall>(
            r#"{"job_id":"j","call_id":"c","attempt":1,"tool":"echo","arguments":"{}","idempotency_key":"k","shell":"rm"}"#,
        );
        assert!(err.is_err());
    }
}

/// How far a running call has come, as its tool reports it (an MCP
/// server's `notifications/progress`, or any tool's own): published by the
/// worker on the call's reply subject with the [`PROGRESS`] header, and
/// recorded by the orchestrator that runs the job as a
/// `tool_call_progress` event. Advisory: a report may be dropped (rate
/// limits, an outage) without harm.
///
/// [`PROGRESS`]: crate::names::headers::PROGRESS
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressReport {
    /// How far, in the tool's own unit; it should grow with each report.
    pub progress: f64,
    /// Where `progress` ends, when the tool knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// A short note for people, at most [`ProgressReport::MAX_MESSAGE_CHARS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ProgressReport {
    /// Longest message kept, in characters.
    pub const MAX_MESSAGE_CHARS: usize = 200;
    /// Longest report read off the bus, in bytes.
    pub const MAX_BYTES: usize = 1024;

    /// The report as it may be shown: `None` when a number is not finite
    /// (or negative); the message cut to [`MAX_MESSAGE_CHARS`] with every
    /// control character (a terminal escape, a newline) made a space, and
    /// dropped when nothing is left.
    ///
    /// [`MAX_MESSAGE_CHARS`]: Self::MAX_MESSAGE_CHARS
    pub fn sanitized(self) -> Option<Self> {
        let number = |n: f64| n.is_finite() && n >= 0.0;
        if !number(self.progress) || self.total.is_some_and(|total| !number(total)) {
            return None;
        }
        let message = self.message.and_then(|message| {
            let plain: String = message
                .chars()
                .take(Self::MAX_MESSAGE_CHARS)
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            let plain = plain.trim();
            (!plain.is_empty()).then(|| plain.to_owned())
        });
        Some(Self { message, ..self })
    }

    /// A report read from the bus: bounded, decoded and [`sanitized`](Self::sanitized).
    pub fn read(payload: &[u8]) -> Option<Self> {
        if payload.len() > Self::MAX_BYTES {
            return None;
        }
        serde_json::from_slice::<Self>(payload).ok()?.sanitized()
    }
}

#[cfg(test)]
mod progress_tests {
    use super::ProgressReport;

    #[test]
    fn a_report_is_bounded_and_its_message_made_plain() {
        let read = |text: &str| ProgressReport::read(text.as_bytes());
        let half = read(r#"{"progress": 5, "total": 10, "message": "half\u001b[31m way\n"}"#);
        let half = half.expect("a good report");
        assert_eq!(half.total, Some(10.0));
        assert_eq!(half.message.as_deref(), Some("half [31m way"));
        assert_eq!(read(r#"{"progress": 1}"#).unwrap().message, None);
        assert_eq!(
            read(r#"{"progress": 1, "message": " \n "}"#)
                .unwrap()
                .message,
            None
        );
        let long = format!(r#"{{"progress": 1, "message": "{}"}}"#, "é".repeat(300));
        let cut = read(&long).unwrap().message.unwrap();
        assert_eq!(cut.chars().count(), ProgressReport::MAX_MESSAGE_CHARS);
        for bad in [
            r#"{"progress": -1}"#,
            r#"{"progress": 1, "total": -2}"#,
            r#"{"total": 2}"#,
            r#"{"progress": "1"}"#,
            "not json",
        ] {
            assert_eq!(read(bad), None, "{bad}");
        }
        let huge = format!(r#"{{"progress": 1, "message": "{}"}}"#, "a".repeat(2000));
        assert_eq!(read(&huge), None, "over MAX_BYTES");
    }
}
