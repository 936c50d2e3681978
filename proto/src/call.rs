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
    /// The model's id for the call (`call_...`), unique within the job.
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

impl ToolCall {
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

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<ToolCall>(
            r#"{"job_id":"j","call_id":"c","attempt":1,"tool":"echo","arguments":"{}","idempotency_key":"k","shell":"rm"}"#,
        );
        assert!(err.is_err());
    }
}
