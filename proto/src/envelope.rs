//! The result envelope every tool call ends in, whoever produced it:
//!
//! ```json
//! {"ok": true, "data": {"temperature": 22}}
//! {"ok": false, "error": {"code": "TOOL_TIMEOUT", "message": "...", "retryable": true}}
//! ```
//!
//! The envelope is exactly what the model sees as the tool's output, so its
//! `message` never carries internals (stack traces, hosts, keys).

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// A stable, UPPER_SNAKE error code. Tools may define their own with
/// [`ErrorCode::custom`]; the common ones are associated constants.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ErrorCode(Cow<'static, str>);

impl ErrorCode {
    /// The arguments are not JSON, do not match the tool's schema, or break a
    /// business rule of the tool. Terminal.
    pub const INVALID_TOOL_ARGUMENTS: Self = Self::from_static("INVALID_TOOL_ARGUMENTS");
    /// No such tool, or not allowed for this job. Terminal.
    pub const UNKNOWN_TOOL: Self = Self::from_static("UNKNOWN_TOOL");
    /// The tool did not finish within its timeout. Retryable.
    pub const TOOL_TIMEOUT: Self = Self::from_static("TOOL_TIMEOUT");
    /// The tool failed in a way it did not classify (or panicked). Terminal.
    pub const TOOL_EXECUTION_FAILED: Self = Self::from_static("TOOL_EXECUTION_FAILED");
    /// The call's deadline passed before it could run. Terminal.
    pub const DEADLINE_EXCEEDED: Self = Self::from_static("DEADLINE_EXCEEDED");
    /// A person rejected the call before it ran (its message is their
    /// reason). Terminal.
    pub const REJECTED_BY_APPROVER: Self = Self::from_static("REJECTED_BY_APPROVER");
    /// Nobody approved or rejected the call within `approval.timeout`.
    /// Terminal.
    pub const APPROVAL_EXPIRED: Self = Self::from_static("APPROVAL_EXPIRED");
    /// A call whose outcome was unknown, failed by an operator's verdict
    /// (its message is their reason). Terminal.
    pub const FAILED_BY_OPERATOR: Self = Self::from_static("FAILED_BY_OPERATOR");
    /// The job was cancelled. Terminal.
    pub const CANCELLED: Self = Self::from_static("CANCELLED");
    /// A dependency is rate limiting; see `retry_after_ms`. Retryable.
    pub const RATE_LIMITED: Self = Self::from_static("RATE_LIMITED");
    /// The orchestrator gave up after the tool's attempt limit. Terminal.
    pub const MAX_ATTEMPTS_EXCEEDED: Self = Self::from_static("MAX_ATTEMPTS_EXCEEDED");
    /// The call was delivered to workers too often without an answer (a poison
    /// call that kills its worker). Terminal.
    pub const MAX_DELIVERIES_EXCEEDED: Self = Self::from_static("MAX_DELIVERIES_EXCEEDED");
    /// A side-effecting call's worker died after the call started, and the
    /// tool cannot tell whether the effect happened. Terminal: the call is
    /// not run again blindly. The error carries `side_effect: "unknown"`.
    pub const OUTCOME_UNKNOWN: Self = Self::from_static("OUTCOME_UNKNOWN");
    /// The arguments or the output exceed the configured size limit. Terminal.
    pub const PAYLOAD_TOO_LARGE: Self = Self::from_static("PAYLOAD_TOO_LARGE");
    /// An earlier call of the job had the same call id; this one was not
    /// run. Terminal.
    pub const DUPLICATE_CALL_ID: Self = Self::from_static("DUPLICATE_CALL_ID");
    /// The model made more calls in one turn than the job allows
    /// (`api.max_calls_per_turn`); this one was not run. Terminal.
    pub const TOO_MANY_CALLS: Self = Self::from_static("TOO_MANY_CALLS");
    /// The result stored for this attempt answers another call (other tool
    /// or arguments, the same ids: a forged call got there first), so it was
    /// refused. Retryable: the next attempt has keys of its own.
    pub const FOREIGN_RESULT: Self = Self::from_static("FOREIGN_RESULT");
    /// The call queue (JetStream) refused the call's message for a reason
    /// no leader election explains (the stream full or sealed, say), so no
    /// worker got the call and it did not run. Terminal: the queue would
    /// refuse it again. A message larger than the queue takes is
    /// `PAYLOAD_TOO_LARGE` instead.
    pub const DISPATCH_REFUSED: Self = Self::from_static("DISPATCH_REFUSED");
    /// A `read_result` reference names a result of another job (of this
    /// tenant or another): a job reads only its own shaped results.
    /// Terminal.
    pub const RESULT_OF_ANOTHER_JOB: Self = Self::from_static("RESULT_OF_ANOTHER_JOB");
    /// A `read_result` reference is not one, or names no shaped result of
    /// this job. Terminal.
    pub const NO_SUCH_RESULT: Self = Self::from_static("NO_SUCH_RESULT");
    /// A `read_result` offset is past the end of the result. Terminal.
    pub const OFFSET_OUT_OF_RANGE: Self = Self::from_static("OFFSET_OUT_OF_RANGE");
    /// The job, or its tenant, spent a budget (tool calls, cost units,
    /// model tokens, job time): this call was not run, or not run again,
    /// and the job gets no more model turns. Terminal.
    pub const BUDGET_EXCEEDED: Self = Self::from_static("BUDGET_EXCEEDED");
    /// The tool's circuit breaker is open: too many of its recent calls
    /// failed, so this call was not run (docs/protection.md). Decided
    /// before the call's first attempt, which it does not use up; the
    /// message says why and how many. Terminal: the tool is left out of
    /// the model's next turns until its cool-down has passed.
    pub const TOOL_UNAVAILABLE: Self = Self::from_static("TOOL_UNAVAILABLE");
    /// The version of the tool the call was made for (the schema its model
    /// was shown) has had no live worker for longer than the fleet waits
    /// (`dispatch.version_gone_after`): the call was not run. Terminal: the
    /// model's next turn is offered the tool's current version, which it
    /// may call again (decision 0058).
    pub const TOOL_VERSION_GONE: Self = Self::from_static("TOOL_VERSION_GONE");

    /// A code known at compile time.
    pub const fn from_static(code: &'static str) -> Self {
        Self(Cow::Borrowed(code))
    }

    /// A tool-specific code, such as `LOCATION_NOT_FOUND`.
    pub fn custom(code: impl Into<String>) -> Self {
        Self(Cow::Owned(code.into()))
    }

    /// The code as it appears on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A value echoed back in an error message, at most `max_chars` characters,
/// with `…` where it was cut: an error must never carry unbounded input.
pub fn excerpt(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The error half of an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// Stable code the model and clients can branch on.
    pub code: ErrorCode,
    /// Human (and model) readable; never contains internals.
    pub message: String,
    /// Whether another attempt of the same call may succeed.
    pub retryable: bool,
    /// How long to wait before retrying, when the failing side said so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// What is known of the call's side effect when it is not "none": only
    /// `"unknown"` today (see `OUTCOME_UNKNOWN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_effect: Option<String>,
}

/// The outcome of one tool call attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Envelope {
    /// The tool succeeded with this data.
    Ok(Value),
    /// The call failed; the body says whether to retry.
    Err(ErrorBody),
}

impl Envelope {
    /// A terminal error envelope.
    pub fn terminal(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Err(ErrorBody {
            code,
            message: message.into(),
            retryable: false,
            retry_after_ms: None,
            side_effect: None,
        })
    }

    /// A retryable error envelope.
    pub fn retryable(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Err(ErrorBody {
            code,
            message: message.into(),
            retryable: true,
            retry_after_ms: None,
            side_effect: None,
        })
    }

    /// True for `{"ok": true, ...}`.
    pub fn is_ok(&self) -> bool {
        matches!(self, Self::Ok(_))
    }

    /// The error, if this is one.
    pub fn error(&self) -> Option<&ErrorBody> {
        match self {
            Self::Ok(_) => None,
            Self::Err(e) => Some(e),
        }
    }

    /// The JSON text of the envelope.
    pub fn to_json(&self) -> String {
        // Serializing a Value-based structure with string keys cannot fail.
        serde_json::to_string(self).expect("envelope serializes")
    }
}

/// What the call ledger stores for an attempt: the envelope, bound to the
/// call it answers (its tool and a SHA-256 of its arguments). The ids of a
/// call are not enough: a forged call with a victim's job, call and attempt
/// but other arguments would otherwise have its result taken as the
/// victim's. Readers check [`answers`](Self::answers) and refuse a record
/// that does not answer their call.
///
/// Unknown fields are ignored, so that a field added later does not make an
/// older orchestrator refuse a newer worker's records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredResult {
    /// The tool the call was for.
    pub tool: String,
    /// SHA-256 of the call's arguments text, in hex.
    pub arguments_sha256: String,
    /// The answer.
    pub envelope: Envelope,
    /// How long the worker worked on the attempt (checks and run), on its
    /// own clock, in microseconds; absent in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worked_us: Option<u64>,
    /// The contract hash of the tool the worker ran the call on: the
    /// version it was pinned to (decision 0058). Absent in older records,
    /// and for a call answered without running (`TOOL_VERSION_GONE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_version: Option<String>,
    /// The record's format (`crate::format`); absent: format 1. Any JSON,
    /// so that a newer release's marker, whatever it looks like, is read
    /// as a format this release refuses ([`format`](Self::format)), never
    /// as a record that does not parse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<serde_json::Value>,
}

impl StoredResult {
    /// The record of `envelope` as the answer to `call`.
    pub fn new(call: &crate::ToolCall, envelope: Envelope) -> Self {
        Self {
            tool: call.tool.clone(),
            arguments_sha256: arguments_sha256(&call.arguments),
            envelope,
            worked_us: None,
            tool_version: None,
            format: crate::format::written().map(|_| crate::format::CURRENT.into()),
        }
    }

    /// The record's format, when this release reads it.
    ///
    /// # Errors
    ///
    /// [`Unreadable`](crate::format::Unreadable): a newer release's format
    /// (or a `format` that is not one): the record must not be read as one
    /// this release knows.
    pub fn format(&self) -> Result<u32, crate::format::Unreadable> {
        let marker = self.format.as_ref().map(|format| match format {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        });
        crate::format::read("a call's result", marker.as_deref())
    }

    /// The record, saying that the worker ran the call on the version of
    /// its tool whose contract hash is `contract` (not from a process that
    /// plays the release before, which named no versions).
    #[must_use]
    pub fn ran_on(self, contract: &str) -> Self {
        if crate::release::is_previous() {
            return self;
        }
        Self {
            tool_version: Some(contract.to_owned()),
            ..self
        }
    }

    /// The record, saying that the worker worked `worked` on it.
    #[must_use]
    pub fn worked(self, worked: std::time::Duration) -> Self {
        Self {
            worked_us: Some(u64::try_from(worked.as_micros()).unwrap_or(u64::MAX)),
            ..self
        }
    }

    /// Whether this record answers a call of `tool` with `arguments`.
    pub fn answers(&self, tool: &str, arguments: &str) -> bool {
        self.tool == tool && self.arguments_sha256 == arguments_sha256(arguments)
    }

    /// The JSON text stored in Redis.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a stored result serializes")
    }

    /// Reads what the ledger holds for an attempt. A bare envelope is what
    /// workers stored before results were bound to their call: it is read
    /// as the answer of the call whose ids it is stored under (`tool` and
    /// `arguments` are the reader's), so that calls in flight during an
    /// upgrade keep their answers. Anyone who can write Redis can still
    /// write one, which Redis ACLs, not this format, must prevent.
    ///
    /// # Errors
    ///
    /// The text is neither a record nor an envelope.
    pub fn read(text: &str, tool: &str, arguments: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str::<Self>(text).or_else(|record_error| {
            serde_json::from_str::<Envelope>(text)
                .map(|envelope| Self {
                    tool: tool.to_owned(),
                    arguments_sha256: arguments_sha256(arguments),
                    envelope,
                    worked_us: None,
                    tool_version: None,
                    format: None,
                })
                .map_err(|_| record_error)
        })
    }
}

/// SHA-256 of a call's arguments text, in hex (the digest's own formatting:
/// a `format!` per byte showed in the orchestrator's profile, as every
/// stored result is matched to its call by it).
pub fn arguments_sha256(arguments: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(arguments.as_bytes()))
}

/// The on-the-wire shape; `ok` decides which of the other two fields is present.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireEnvelope<'a> {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<Cow<'a, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<Cow<'a, ErrorBody>>,
}

impl Serialize for Envelope {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let wire = match self {
            Self::Ok(data) => WireEnvelope {
                ok: true,
                data: Some(Cow::Borrowed(data)),
                error: None,
            },
            Self::Err(error) => WireEnvelope {
                ok: false,
                data: None,
                error: Some(Cow::Borrowed(error)),
            },
        };
        wire.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Envelope {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let wire = WireEnvelope::deserialize(deserializer)?;
        match (wire.ok, wire.data, wire.error) {
            (true, data, None) => Ok(Self::Ok(data.map_or(Value::Null, Cow::into_owned))),
            (false, None, Some(error)) => Ok(Self::Err(error.into_owned())),
            (true, _, Some(_)) => Err(D::Error::custom("an ok envelope has no error")),
            (false, _, None) => Err(D::Error::custom("an error envelope needs an error")),
            (false, Some(_), Some(_)) => Err(D::Error::custom("an error envelope has no data")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn the_arguments_hash_is_the_hex_of_their_sha256() {
        // Stored results carry it: it must never change between versions.
        // (`sha256sum` of the two bytes `{}`.)
        assert_eq!(
            arguments_sha256("{}"),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    /// A call of `calculate` with `2+2`.
    fn two_plus_two() -> crate::ToolCall {
        crate::ToolCall {
            job_id: "acme-0190000000010000000000001234".into(),
            call_id: "c1".into(),
            attempt: 1,
            tool: "calculate".into(),
            arguments: r#"{"expression":"2+2"}"#.into(),
            deadline_ms: None,
            idempotency_key: "k".into(),
            reply_to: None,
        }
    }

    #[test]
    fn a_stored_result_answers_the_call_it_was_stored_for() {
        let call = two_plus_two();
        let record = StoredResult::new(&call, Envelope::Ok(serde_json::json!(4)));
        let text = record.to_json();
        let back = StoredResult::read(&text, "other", "{}").unwrap();
        assert_eq!(back, record, "a record keeps its own binding");
        assert!(back.answers("calculate", r#"{"expression":"2+2"}"#));
        assert!(!back.answers("calculate", r#"{"expression":"1000000"}"#));
        assert!(!back.answers("echo", r#"{"expression":"2+2"}"#));
        // A bare envelope from before binding answers whoever reads it.
        let legacy = StoredResult::read(r#"{"ok":true,"data":4}"#, "echo", "{}").unwrap();
        assert!(legacy.answers("echo", "{}"));
        assert!(StoredResult::read("not json", "echo", "{}").is_err());
    }

    /// A record as the release before formats were marked wrote it, read
    /// by this one; this release's records say their format; a newer
    /// format is never read as one this release knows.
    #[test]
    fn a_stored_result_says_its_format_and_reads_the_release_before() {
        let sha = arguments_sha256(r#"{"expression":"2+2"}"#);
        let before = format!(
            r#"{{"tool":"calculate","arguments_sha256":"{sha}","envelope":{{"ok":true,"data":4}},"worked_us":31}}"#
        );
        let record = StoredResult::read(&before, "echo", "{}").unwrap();
        assert_eq!(record.format(), Ok(1));
        assert!(record.answers("calculate", r#"{"expression":"2+2"}"#));
        assert_eq!((record.worked_us, record.tool_version), (Some(31), None));

        let call = two_plus_two();
        let now = StoredResult::new(&call, Envelope::Ok(serde_json::json!(4))).ran_on("c0ffee");
        let text = now.to_json();
        assert!(text.contains(r#""format":2"#), "{text}");
        let back = StoredResult::read(&text, "echo", "{}").unwrap();
        assert_eq!(
            (back.format(), back.tool_version.as_deref()),
            (Ok(2), Some("c0ffee"))
        );

        for newer in [
            r#"3"#,
            r#""3""#,
            r#""two""#,
            r#"-1"#,
            r#"2.5"#,
            r#"{"major":3}"#,
        ] {
            let text = format!(
                r#"{{"tool":"calculate","arguments_sha256":"{sha}","envelope":{{"ok":true,"data":4}},"format":{newer}}}"#
            );
            let record = StoredResult::read(&text, "echo", "{}").expect("it parses");
            assert!(
                record.format().is_err(),
                "{newer} was read as a known format"
            );
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "\\PC{0,20}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arb_envelope() -> impl Strategy<Value = Envelope> {
        prop_oneof![
            arb_json().prop_map(Envelope::Ok),
            (
                "[A-Z][A-Z_]{0,30}",
                "\\PC{0,80}",
                any::<bool>(),
                proptest::option::of(any::<u64>())
            )
                .prop_map(|(code, message, retryable, retry_after_ms)| {
                    Envelope::Err(ErrorBody {
                        code: ErrorCode::custom(code),
                        message,
                        retryable,
                        retry_after_ms,
                        side_effect: None,
                    })
                }),
        ]
    }

    #[test]
    fn excerpts_count_characters_and_mark_the_cut() {
        assert_eq!(excerpt("héllo", 3), "hél…");
        assert_eq!(excerpt("héllo", 5), "héllo");
    }

    proptest! {
        #[test]
        fn any_envelope_survives_json(envelope in arb_envelope()) {
            let text = envelope.to_json();
            let back: Envelope = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(back, envelope);
        }
    }

    #[test]
    fn wire_shape_matches_the_design() {
        let ok = Envelope::Ok(json!({"temperature": 22}));
        assert_eq!(
            serde_json::to_value(&ok).unwrap(),
            json!({"ok": true, "data": {"temperature": 22}})
        );
        let err = Envelope::retryable(ErrorCode::TOOL_TIMEOUT, "too slow");
        assert_eq!(
            serde_json::to_value(&err).unwrap(),
            json!({"ok": false, "error": {"code": "TOOL_TIMEOUT", "message": "too slow", "retryable": true}})
        );
    }

    #[test]
    fn contradictory_envelopes_are_rejected() {
        for bad in [
            json!({"ok": true, "error": {"code": "X", "message": "", "retryable": false}}),
            json!({"ok": false}),
            json!({"ok": false, "data": 1, "error": {"code": "X", "message": "", "retryable": false}}),
            json!({"data": 1}),
            json!({"ok": true, "data": 1, "extra": 2}),
        ] {
            assert!(
                serde_json::from_value::<Envelope>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
