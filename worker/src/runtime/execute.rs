//! The life of one delivered call, in four steps:
//!
//! 1. [`claim`]: claim the attempt in the Redis ledger. A stored result is
//!    answered again, a live claim elsewhere is handed back for later, and a
//!    delivery past `runtime.max_deliveries` is answered without running.
//! 2. [`check`]: the pure checks of the call against the loaded tool (served,
//!    deadline, argument size, JSON Schema).
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
mod run;
mod settle;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_nats::jetstream::Message;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::{ToolCall, ToolManifest};
use tracing::{Instrument, debug, error, info_span};

use crate::config::RuntimeOptions;
use crate::ledger::Ledger;
use crate::metrics;
use crate::tool::ErasedTool;
use claim::Claimed;
use run::Ran;
use settle::Outcome;

/// A tool ready to execute: its implementation, manifest and compiled schema.
pub(crate) struct LoadedTool {
    pub(crate) tool: Arc<dyn ErasedTool>,
    pub(crate) manifest: ToolManifest,
    validator: jsonschema::Validator,
    timeout: Duration,
}

/// A manifest whose JSON Schema does not compile.
#[derive(Debug, thiserror::Error)]
#[error("the JSON Schema of tool {tool} is invalid: {message}")]
pub struct SchemaError {
    /// The tool.
    pub tool: String,
    /// What the validator said.
    pub message: String,
}

impl LoadedTool {
    /// Compiles the tool's schema once, so each call only validates.
    pub(crate) fn load(
        tool: Arc<dyn ErasedTool>,
        timeout_override: Option<Duration>,
    ) -> Result<Self, SchemaError> {
        let mut manifest = tool.manifest();
        if let Some(timeout) = timeout_override {
            manifest.timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        }
        let validator =
            jsonschema::validator_for(&manifest.parameters).map_err(|e| SchemaError {
                tool: manifest.name.clone(),
                message: e.to_string(),
            })?;
        let timeout = Duration::from_millis(manifest.timeout_ms.max(1));
        Ok(Self {
            tool,
            manifest,
            validator,
            timeout,
        })
    }
}

/// Executes deliveries; shared by all pull loops of a process.
pub(crate) struct Executor {
    pub(crate) tools: HashMap<String, LoadedTool>,
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
        let outcome = match decode(&message) {
            Ok(call) => {
                let span = info_span!("call", job_id = %call.job_id, call_id = %call.call_id,
                                      tool = %call.tool, attempt = call.attempt);
                self.process(&tool, &call, &message).instrument(span).await
            }
            Err(reason) => {
                metrics::call_rejected(reason);
                Outcome::Undecodable
            }
        };
        settle::acknowledge(&message, outcome).await;
        metrics::in_flight(-1.0);
    }

    /// The four steps for a decoded call; returns how the delivery ended.
    async fn process(&self, subject_tool: &str, call: &ToolCall, message: &Message) -> Outcome {
        // Unique per delivery: a redelivery to this same process while the
        // first delivery still runs must not count as the same owner.
        let owner = format!("{}:{:016x}", self.worker_id, rand::random::<u64>());
        let earlier = match self.claim(call, &owner).await {
            Claimed::Stored(envelope) => return self.reply_stored(call, envelope).await,
            Claimed::Later(delay) => return Outcome::Retry(delay),
            Claimed::Acquired(earlier) => earlier,
        };
        let started = Instant::now();
        // The checks never await, so only `run` has to watch the abandon token.
        let checked = check::check(
            &self.tools,
            subject_tool,
            call,
            self.options.max_argument_bytes,
            SystemTime::now(),
        );
        let envelope = match checked {
            Err(envelope) => envelope,
            Ok(checked) => match self.run(checked, call, message, &owner, earlier).await {
                Ran::Finished(envelope) => envelope,
                Ran::Abandoned => return self.hand_back(call, &owner, Duration::ZERO).await,
                // Not at once: what the probe asks is down for a moment.
                Ran::AskLater => return self.hand_back(call, &owner, Duration::from_secs(1)).await,
            },
        };
        metrics::call_finished(&call.tool, &envelope, started.elapsed());
        debug!(
            ok = envelope.is_ok(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "call finished"
        );
        self.settle(call, &owner, &envelope, started.elapsed())
            .await
    }
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
