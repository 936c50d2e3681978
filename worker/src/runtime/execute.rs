//! The life of one delivered call: decode, claim, check, execute, store,
//! reply, ack.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{AckKind, Message};
use async_nats::{HeaderMap, Subject};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::names::headers;
use toolfleet_proto::{Envelope, ErrorBody, ErrorCode, ToolCall, ToolManifest, check_arguments};
use tracing::{Instrument, debug, error, info_span, warn};

use crate::config::RuntimeOptions;
use crate::envelope::{GENERIC_FAILURE, from_error};
use crate::ledger::{Claim, Ledger};
use crate::metrics;
use crate::tool::{Applied, ErasedTool, ToolContext};

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

/// The terminal envelope of a side effect that may or may not have happened.
fn outcome_unknown(message: &str) -> Envelope {
    Envelope::Err(ErrorBody {
        code: ErrorCode::OUTCOME_UNKNOWN,
        message: message.to_owned(),
        retryable: false,
        retry_after_ms: None,
        side_effect: Some("unknown".to_owned()),
    })
}

/// Cancels a tool's token and aborts its task when dropped: on timeout, and
/// when the drain abandons the call (the evaluating future is dropped).
struct StopOnDrop {
    task: tokio::task::AbortHandle,
    token: CancellationToken,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.token.cancel();
        self.task.abort();
    }
}

/// How a delivery ended, for the ack and the metrics.
enum Outcome {
    /// Answered (executed now, or from the stored result): ack.
    Answered,
    /// Not answered; JetStream should redeliver after `delay`.
    Retry(Duration),
    /// The message can never be answered (undecodable): terminate it.
    Poison,
}

impl Executor {
    /// Handles one delivery to the end, including its ack. Never panics on
    /// bad input: every outcome is an envelope or an ack decision.
    pub(crate) async fn handle(self: Arc<Self>, tool: String, message: Message) {
        metrics::in_flight(1.0);
        let outcome = match serde_json::from_slice::<ToolCall>(&message.payload) {
            Ok(call) => {
                let span = info_span!("call", job_id = %call.job_id, call_id = %call.call_id,
                                      tool = %call.tool, attempt = call.attempt);
                self.process(&tool, &call, &message).instrument(span).await
            }
            Err(err) => {
                error!(subject = %message.subject, error = %err, "undecodable call message dropped");
                Outcome::Poison
            }
        };
        let ack = match outcome {
            Outcome::Answered => AckKind::Ack,
            Outcome::Retry(delay) => AckKind::Nak(Some(delay)),
            Outcome::Poison => AckKind::Term,
        };
        if let Err(err) = message.ack_with(ack).await {
            // Without the ack JetStream redelivers, and the ledger answers the
            // redelivery from the stored result: nothing runs twice.
            warn!(error = %err, "ack failed; the call will be redelivered");
        }
        metrics::in_flight(-1.0);
    }

    async fn process(&self, subject_tool: &str, call: &ToolCall, message: &Message) -> Outcome {
        // Unique per delivery: a redelivery to this same process while the
        // first delivery still runs must not count as the same owner.
        let owner = format!("{}:{:016x}", self.worker_id, rand::random::<u64>());
        let side_effects = self
            .tools
            .get(&call.tool)
            .is_some_and(|t| t.manifest.side_effects);
        let claim = match self.ledger.claim(call, &owner, side_effects).await {
            Ok(claim) => claim,
            Err(err) => {
                warn!(error = %err, "redis unavailable; call handed back without executing");
                return Outcome::Retry(Duration::from_secs(1));
            }
        };
        match claim {
            Claim::Stored(envelope) => {
                debug!("answered from the stored result");
                metrics::dedup_hit(&call.tool);
                self.reply(call, envelope.into_bytes(), true).await;
                Outcome::Answered
            }
            Claim::HeldBy(holder) => {
                debug!(holder = %holder, "call is being executed elsewhere");
                Outcome::Retry(self.ledger.lease())
            }
            Claim::Acquired { previously_started } => {
                let delivered = message.info().map_or(1, |info| info.delivered);
                if delivered > self.options.max_deliveries {
                    // Every earlier delivery died without an answer (no result,
                    // no live claim): a poison call. Answer instead of running
                    // it again, so the job is not stuck.
                    warn!(delivered, "poison call: answered without executing");
                    let envelope = Envelope::terminal(
                        ErrorCode::MAX_DELIVERIES_EXCEEDED,
                        format!(
                            "the call was delivered {} times and no worker finished it; it was not run again",
                            delivered - 1
                        ),
                    );
                    return self.answer(call, &owner, &envelope).await;
                }
                self.execute(subject_tool, call, message, &owner, previously_started)
                    .await
            }
        }
    }

    /// Stores `envelope` as the attempt's result and publishes what is stored.
    async fn answer(&self, call: &ToolCall, owner: &str, envelope: &Envelope) -> Outcome {
        let stored = match self.ledger.complete(call, owner, &envelope.to_json()).await {
            Ok(stored) => stored,
            Err(err) => {
                // The result is not durable: hand the call back rather than
                // answer with something a redelivery might contradict.
                warn!(error = %err, "could not store the result; call handed back");
                return Outcome::Retry(Duration::from_secs(1));
            }
        };
        self.reply(call, stored.into_bytes(), false).await;
        Outcome::Answered
    }

    async fn execute(
        &self,
        subject_tool: &str,
        call: &ToolCall,
        message: &Message,
        owner: &str,
        previously_started: bool,
    ) -> Outcome {
        let started = Instant::now();
        let envelope = tokio::select! {
            envelope = self.evaluate(subject_tool, call, message, owner, previously_started) => envelope,
            () = self.abandon.cancelled() => {
                warn!("drain timeout: call abandoned and handed back");
                if let Err(err) = self.ledger.release(call, owner).await {
                    warn!(error = %err, "could not release the claim; redelivery waits for its lease");
                }
                return Outcome::Retry(Duration::ZERO);
            }
        };
        metrics::call_finished(&call.tool, &envelope, started.elapsed());
        debug!(
            ok = envelope.is_ok(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "call finished"
        );
        self.answer(call, owner, &envelope).await
    }

    /// Produces the envelope of one claimed attempt: the checks, then the tool.
    async fn evaluate(
        &self,
        subject_tool: &str,
        call: &ToolCall,
        message: &Message,
        owner: &str,
        previously_started: bool,
    ) -> Envelope {
        let Some(loaded) = self
            .tools
            .get(&call.tool)
            .filter(|_| call.tool == subject_tool)
        else {
            warn!(subject_tool, "call for a tool this worker does not serve");
            return Envelope::terminal(
                ErrorCode::UNKNOWN_TOOL,
                format!("no tool named {:?} is available", call.tool),
            );
        };
        let deadline = call
            .deadline_ms
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
        if deadline.is_some_and(|d| d <= SystemTime::now()) {
            return Envelope::terminal(
                ErrorCode::DEADLINE_EXCEEDED,
                "the call's deadline passed before it could start",
            );
        }
        if call.arguments.len() > self.options.max_argument_bytes {
            return Envelope::terminal(
                ErrorCode::PAYLOAD_TOO_LARGE,
                format!(
                    "arguments are {} bytes; the limit is {}",
                    call.arguments.len(),
                    self.options.max_argument_bytes
                ),
            );
        }
        let args = match check_arguments(&loaded.manifest.name, &loaded.validator, &call.arguments)
        {
            Ok(args) => args,
            Err(envelope) => return envelope,
        };
        let timeout = match deadline.and_then(|d| d.duration_since(SystemTime::now()).ok()) {
            Some(left) => loaded.timeout.min(left),
            None => loaded.timeout,
        };
        let ctx = ToolContext {
            job_id: call.job_id.clone(),
            call_id: call.call_id.clone(),
            attempt: call.attempt,
            idempotency_key: call.idempotency_key.clone(),
            deadline,
            // Its own token, not a child of `abandon`: a tool must not be able
            // to answer "cancelled" for a call the drain hands back.
            cancelled: CancellationToken::new(),
        };
        // A side effect may already have happened when an earlier delivery of
        // this attempt died after it started, or when an earlier attempt of
        // the call failed in a way the tool could not be sure about (a
        // connection dropped after the write was sent). The idempotency key
        // is the same for all of them: ask the tool before running again.
        let retry = call.attempt > 1;
        if loaded.manifest.side_effects && (previously_started || retry) {
            match loaded.tool.probe(args.clone(), ctx.clone()).await {
                Applied::Yes(data) => {
                    warn!(
                        previously_started,
                        "earlier execution was applied; answering without running again"
                    );
                    return Envelope::Ok(data);
                }
                Applied::No => debug!("earlier execution was not applied; running the call"),
                // A retry the tool itself asked for (a retryable envelope) is
                // safe to run by the tool's own declaration.
                Applied::Unknown if !previously_started => {
                    debug!("no probe; running the retry the tool asked for");
                }
                Applied::Unknown => {
                    warn!("earlier execution's outcome is unknown; not running again");
                    return outcome_unknown(
                        "the worker running this call died after it started; whether \
                         its side effect happened is unknown, so it was not run again",
                    );
                }
            }
        }
        let cancelled = ctx.cancelled.clone();
        let tool = loaded.tool.clone();
        // Kept for the probe, should a side-effecting call time out midway.
        let for_probe = loaded
            .manifest
            .side_effects
            .then(|| (args.clone(), ctx.clone()));
        debug!(timeout_ms = timeout.as_millis() as u64, "executing call");
        let run = tokio::spawn(
            async move { tool.call(args, ctx).await }.instrument(tracing::Span::current()),
        );
        // Whatever ends this future first (timeout, drain), the tool stops.
        let stop_tool = StopOnDrop {
            task: run.abort_handle(),
            token: cancelled.clone(),
        };
        let result = self.keep_alive(call, message, owner, timeout, run).await;
        drop(stop_tool); // finished, or stopped here on timeout
        match result {
            Some(Ok(Ok(data))) => self.check_output(data),
            Some(Ok(Err(err))) => {
                let envelope = from_error(&err);
                if matches!(err, crate::ToolError::Internal(_)) {
                    error!(error = ?err, "tool failed");
                } else {
                    debug!(error = %err, "tool returned an error");
                }
                envelope
            }
            Some(Err(join)) => {
                // The panic message may hold internals: log it, never send it.
                error!(error = %join, "tool panicked");
                Envelope::terminal(ErrorCode::TOOL_EXECUTION_FAILED, GENERIC_FAILURE)
            }
            None => {
                warn!(timeout_ms = timeout.as_millis() as u64, "tool timed out");
                let timed_out = Envelope::retryable(
                    ErrorCode::TOOL_TIMEOUT,
                    format!(
                        "the tool did not finish within {}",
                        humantime::format_duration(timeout)
                    ),
                );
                match for_probe {
                    // Stopped midway: a retry could apply the effect twice.
                    Some((args, ctx)) => match loaded.tool.probe(args, ctx).await {
                        Applied::Yes(data) => Envelope::Ok(data),
                        Applied::No => timed_out,
                        Applied::Unknown => outcome_unknown(
                            "the tool timed out after it started; whether its side effect \
                             happened is unknown, so it is not retried",
                        ),
                    },
                    None => timed_out,
                }
            }
        }
    }

    /// Awaits the tool up to `timeout` while keeping the JetStream message and
    /// the claim alive, so a long call is neither redelivered nor stolen.
    async fn keep_alive<T>(
        &self,
        call: &ToolCall,
        message: &Message,
        owner: &str,
        timeout: Duration,
        run: tokio::task::JoinHandle<T>,
    ) -> Option<Result<T, tokio::task::JoinError>> {
        let period = (self.options.ack_wait / 3).min(self.ledger.lease() / 3);
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let sleep = tokio::time::sleep(timeout);
        tokio::pin!(run, sleep);
        loop {
            tokio::select! {
                result = &mut run => return Some(result),
                () = &mut sleep => return None,
                _ = ticker.tick() => {
                    if let Err(err) = message.ack_with(AckKind::Progress).await {
                        warn!(error = %err, "could not extend the ack deadline");
                    }
                    match self.ledger.renew(call, owner).await {
                        Ok(true) => {}
                        Ok(false) => warn!("claim lost while executing; another delivery may run the call"),
                        Err(err) => warn!(error = %err, "could not renew the claim"),
                    }
                }
            }
        }
    }

    fn check_output(&self, data: Value) -> Envelope {
        let size = serde_json::to_vec(&data).map_or(usize::MAX, |v| v.len());
        if size > self.options.max_output_bytes {
            warn!(size, "tool output over the limit");
            return Envelope::terminal(
                ErrorCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the tool's output is {size} bytes; the limit is {}",
                    self.options.max_output_bytes
                ),
            );
        }
        Envelope::Ok(data)
    }

    async fn reply(&self, call: &ToolCall, envelope: Vec<u8>, dedup_hit: bool) {
        let Some(reply_to) = &call.reply_to else {
            return;
        };
        let mut headers = HeaderMap::new();
        headers.insert(headers::JOB_ID, call.job_id.as_str());
        headers.insert(headers::CALL_ID, call.call_id.as_str());
        headers.insert(headers::ATTEMPT, call.attempt.to_string().as_str());
        headers.insert(headers::TOOL, call.tool.as_str());
        if dedup_hit {
            headers.insert(headers::DEDUP_HIT, "true");
        }
        let subject = Subject::from(reply_to.as_str());
        if let Err(err) = self
            .nats
            .publish_with_headers(subject, headers, envelope.into())
            .await
        {
            // Redis holds the result; the orchestrator reads it from there.
            warn!(error = %err, "could not publish the result");
        }
    }
}
