//! Step 3: run a checked call. When a side effect may already have happened
//! the tool's probe is asked first (decision 0004); then the tool runs in its
//! own task with its timeout, panics caught, while the message and the claim
//! are kept alive, until it finishes, times out, or the drain abandons it.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{AckKind, Message};
use serde_json::Value;
use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::call::is_valid_call_id;
use toolfleet_proto::names::headers;
use toolfleet_proto::{Envelope, ErrorBody, ErrorCode, ToolCall};
use tracing::{Instrument, debug, error, info, warn};

use super::check::Checked;
use super::claim::Earlier;
use super::{Executor, LoadedTool};
use crate::checkpoint::Checkpoint;
use crate::envelope::{GENERIC_FAILURE, from_error};
use crate::ledger::{Owner, Renewed};
use crate::tool::{Applied, Progress, ToolContext, ToolError};

/// How running a call ended.
#[derive(Debug)]
pub(super) enum Ran {
    /// The call's envelope: the tool's result or failure, or the probe's answer.
    Finished(Envelope),
    /// The drain timeout ran out first: the tool was stopped, and the call
    /// must be handed back without a result.
    Abandoned,
    /// The probe could not reach what it asks: hand the call back, and ask
    /// again on its next delivery.
    AskLater,
    /// The claim lapsed while the probe ran, so another delivery may be
    /// running the call: hand it back without running it.
    ClaimLost,
}

/// How a run kept alive by [`Executor::keep_alive`] ended.
enum Kept<T> {
    /// It finished, with this.
    Done(T),
    /// Its time ran out first.
    TimedOut,
    /// The call's job was cancelled (the ledger's mark): it was stopped.
    Cancelled,
}

/// A tool task that ended before its timeout: its own result, or the panic
/// that ended it.
type Finished = Result<Result<Value, ToolError>, JoinError>;

/// Cancels a tool's token and aborts its task when dropped: on timeout, and
/// when the drain abandons the call (the running future is dropped).
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

impl Executor {
    /// Runs `checked` for the delivery `message`, owned by `owner` (who holds
    /// the attempt's claim, unless it runs without one).
    pub(super) async fn run(
        &self,
        checked: Checked<'_>,
        call: &ToolCall,
        message: &Message,
        owner: &Owner,
        earlier: Earlier,
    ) -> Ran {
        tokio::select! {
            ran = self.probe_and_execute(checked, call, message, owner, earlier) => ran,
            () = self.abandon.cancelled() => {
                warn!("drain timeout: call abandoned and handed back");
                Ran::Abandoned
            }
        }
    }

    async fn probe_and_execute(
        &self,
        checked: Checked<'_>,
        call: &ToolCall,
        message: &Message,
        owner: &Owner,
        earlier: Earlier,
    ) -> Ran {
        if earlier.cancelled {
            debug!("the call's job was cancelled; answered without running");
            return Ran::Finished(job_cancelled());
        }
        let ctx = ToolContext {
            job_id: call.job_id.clone(),
            call_id: call.call_id.clone(),
            model_call_id: model_call_id(message.headers.as_ref()),
            attempt: call.attempt,
            idempotency_key: call.idempotency_key.clone(),
            deadline: checked.deadline,
            // Its own token, not a child of `abandon`: a tool must not be able
            // to answer "cancelled" for a call the drain hands back.
            cancelled: CancellationToken::new(),
            handed_back: self.abandon.clone(),
            // A checkpoint is kept under the claim: a run without one
            // saves none (its tool saves none).
            checkpoint: if owner.claimed {
                Checkpoint::of(
                    self.ledger.clone(),
                    self.ledger.checkpoint_keys(call),
                    owner.id.clone(),
                    earlier.checkpoint,
                )
            } else {
                Checkpoint::default()
            },
            progress: Progress::of(&self.nats, call),
        };
        let repeats_harm = checked.tool.manifest.effects.repeats_harm();
        let previously_started = earlier.started;
        let resumes = ctx.checkpoint.saved().is_some();
        if let Some(poisoned) = earlier.poisoned {
            // Not run again; but an earlier execution may have applied its
            // effect before it died, and then the truth is the probe's.
            let applied = if repeats_harm && previously_started {
                Some(checked.tool.tool.probe(checked.args, ctx).await)
            } else {
                None
            };
            return after_poison(applied, poisoned);
        }
        if needs_probe(repeats_harm, previously_started, call.attempt, resumes) {
            // Kept alive like a run: a slow probe (its store failing over)
            // must not let the message be redelivered and the claim lapse,
            // or another delivery could probe, find nothing, and run the
            // call alongside this one.
            let probe = checked.tool.tool.probe(checked.args.clone(), ctx.clone());
            let applied = match self
                .keep_alive(call, message, owner, checked.timeout, probe)
                .await
            {
                Kept::Done(applied) => applied,
                Kept::TimedOut => Applied::Unavailable,
                Kept::Cancelled => return Ran::Finished(job_cancelled()),
            };
            if let Some(answer) = before_run(applied, previously_started) {
                return answer;
            }
            // It may have lapsed all the same (a renewal that failed): run
            // only while it is still this delivery's.
            match self.ledger.renew(call, owner).await {
                Ok(Renewed::Held) => {}
                Ok(Renewed::Cancelled) => return Ran::Finished(job_cancelled()),
                Ok(Renewed::Lost) | Err(_) => {
                    warn!("claim lost while probing; handed back without running");
                    return Ran::ClaimLost;
                }
            }
        }
        self.execute(checked, ctx, call, message, owner).await
    }

    /// Executes the tool in a task of its own, so that a panic becomes a
    /// `JoinError` instead of unwinding through the worker.
    async fn execute(
        &self,
        checked: Checked<'_>,
        ctx: ToolContext,
        call: &ToolCall,
        message: &Message,
        owner: &Owner,
    ) -> Ran {
        let Checked {
            tool: loaded,
            args,
            timeout,
            ..
        } = checked;
        let cancelled = ctx.cancelled.clone();
        let tool = loaded.tool.clone();
        // Kept for the probe, should a call that is not idempotent time out midway.
        let for_probe = loaded
            .manifest
            .effects
            .repeats_harm()
            .then(|| (args.clone(), ctx.clone()));
        debug!(timeout_ms = timeout.as_millis() as u64, "executing call");
        let run = tokio::spawn(
            async move { tool.call(args, ctx).await }.instrument(tracing::Span::current()),
        );
        // Whatever ends this future first (timeout, drain), the tool stops.
        let stop_tool = StopOnDrop {
            task: run.abort_handle(),
            token: cancelled,
        };
        let result = self.keep_alive(call, message, owner, timeout, run).await;
        drop(stop_tool); // finished, or stopped here on timeout
        match result {
            Kept::Done(finished) => {
                Ran::Finished(envelope_of(finished, self.options.max_output_bytes))
            }
            Kept::TimedOut => timed_out(loaded, for_probe, timeout).await,
            Kept::Cancelled => Ran::Finished(job_cancelled()),
        }
    }

    /// Awaits `run` (the tool, or its probe) up to `timeout` while keeping
    /// the JetStream message and the claim alive, so a long call is neither
    /// redelivered nor stolen; each renewal also finds whether the call's
    /// job was cancelled, and the run is then dropped (stopped).
    async fn keep_alive<F: std::future::Future>(
        &self,
        call: &ToolCall,
        message: &Message,
        owner: &Owner,
        timeout: Duration,
        run: F,
    ) -> Kept<F::Output> {
        let period = (self.options.ack_wait / 3).min(self.ledger.lease() / 3);
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let sleep = tokio::time::sleep(timeout);
        tokio::pin!(run, sleep);
        loop {
            tokio::select! {
                result = &mut run => return Kept::Done(result),
                () = &mut sleep => return Kept::TimedOut,
                _ = ticker.tick() => {
                    if let Err(err) = message.ack_with(AckKind::Progress).await {
                        warn!(error = %err, "could not extend the ack deadline");
                    }
                    match self.ledger.renew(call, owner).await {
                        Ok(Renewed::Held) => {}
                        Ok(Renewed::Cancelled) => {
                            info!("the call's job was cancelled; the call is stopped");
                            return Kept::Cancelled;
                        }
                        Ok(Renewed::Lost) => warn!("claim lost while running; another delivery may run the call"),
                        Err(err) => warn!(error = %err, "could not renew the claim"),
                    }
                }
            }
        }
    }
}

/// Whether the tool's probe must be asked before running. A side effect may
/// already have happened when an earlier delivery of this attempt died after
/// it started, or when an earlier attempt of the call failed in a way the tool
/// could not be sure about (a connection dropped after the write was sent).
/// The idempotency key is the same for all of them. A call that `resumes`
/// from a checkpoint an earlier execution saved is not probed: the tool
/// picks up where that one was (decision 0044).
fn needs_probe(repeats_harm: bool, previously_started: bool, attempt: u32, resumes: bool) -> bool {
    let retry = attempt > 1;
    repeats_harm && (previously_started || retry) && !resumes
}

/// The answer to a poison call, which is not run again: what the probe knows
/// of an earlier execution's side effect (`None`: no effect to ask about),
/// else `poisoned` (`MAX_DELIVERIES_EXCEEDED`, "not run again").
fn after_poison(applied: Option<Applied>, poisoned: Envelope) -> Ran {
    Ran::Finished(match applied {
        None | Some(Applied::No) => poisoned,
        Some(Applied::Yes(data)) => {
            warn!("poison call whose effect was applied; answering with it");
            Envelope::Ok(data)
        }
        Some(Applied::Unavailable) => return ask_later(),
        Some(Applied::Unknown) => outcome_unknown(
            "every worker running this call died after it started; whether its \
             side effect happened is unknown, so it was not run again",
        ),
    })
}

/// The probe could not ask now: the call goes back to the queue, so that the
/// model is told what happened rather than "unknown".
fn ask_later() -> Ran {
    warn!("the probe cannot reach what it asks; call handed back to ask again");
    Ran::AskLater
}

/// What the probe's answer means before running: `Some` ends the delivery
/// without running the call, `None` runs it.
fn before_run(applied: Applied, previously_started: bool) -> Option<Ran> {
    match applied {
        Applied::Yes(data) => {
            warn!(
                previously_started,
                "earlier execution was applied; answering without running again"
            );
            Some(Ran::Finished(Envelope::Ok(data)))
        }
        Applied::Unavailable => Some(ask_later()),
        Applied::No => {
            debug!("earlier execution was not applied; running the call");
            None
        }
        // A retry the tool itself asked for (a retryable envelope) is safe to
        // run by the tool's own declaration.
        Applied::Unknown if !previously_started => {
            debug!("no probe; running the retry the tool asked for");
            None
        }
        Applied::Unknown => {
            warn!("earlier execution's outcome is unknown; not running again");
            Some(Ran::Finished(outcome_unknown(
                "the worker running this call died after it started; whether \
                 its side effect happened is unknown, so it was not run again",
            )))
        }
    }
}

/// The envelope of a tool that finished in time: its data (within the output
/// limit), its classified failure, or a panic.
fn envelope_of(finished: Finished, max_output_bytes: usize) -> Envelope {
    match finished {
        Ok(Ok(data)) => check_output(data, max_output_bytes),
        Ok(Err(err)) => {
            let envelope = from_error(&err);
            if matches!(err, ToolError::Internal(_)) {
                error!(error = ?err, "tool failed");
            } else {
                debug!(error = %err, "tool returned an error");
            }
            envelope
        }
        Err(join) => {
            // The panic message may hold internals: log it, never send it.
            error!(error = %join, "tool panicked");
            Envelope::terminal(ErrorCode::TOOL_EXECUTION_FAILED, GENERIC_FAILURE)
        }
    }
}

fn check_output(data: Value, max_output_bytes: usize) -> Envelope {
    let size = serde_json::to_vec(&data).map_or(usize::MAX, |v| v.len());
    if size > max_output_bytes {
        warn!(size, "tool output over the limit");
        return Envelope::terminal(
            ErrorCode::PAYLOAD_TOO_LARGE,
            format!("the tool's output is {size} bytes; the limit is {max_output_bytes}"),
        );
    }
    Envelope::Ok(data)
}

/// The envelope of a tool stopped by its timeout. A tool that is not idempotent was
/// stopped midway, so a retry could apply the effect twice: its probe decides.
async fn timed_out(
    loaded: &LoadedTool,
    for_probe: Option<(Value, ToolContext)>,
    timeout: Duration,
) -> Ran {
    warn!(timeout_ms = timeout.as_millis() as u64, "tool timed out");
    let timed_out = Envelope::retryable(
        ErrorCode::TOOL_TIMEOUT,
        format!(
            "the tool did not finish within {}",
            humantime::format_duration(timeout)
        ),
    );
    match for_probe {
        Some((args, ctx)) => after_timeout(loaded.tool.probe(args, ctx).await, timed_out),
        None => Ran::Finished(timed_out),
    }
}

/// What the probe's answer means for a call that is not idempotent and timed out.
fn after_timeout(applied: Applied, timed_out: Envelope) -> Ran {
    Ran::Finished(match applied {
        Applied::Yes(data) => Envelope::Ok(data),
        Applied::No => timed_out,
        Applied::Unavailable => return ask_later(),
        Applied::Unknown => outcome_unknown(
            "the tool timed out after it started; whether its side effect \
             happened is unknown, so it is not retried",
        ),
    })
}

/// The model's own id of the call, from the
/// [`MODEL_CALL_ID`](headers::MODEL_CALL_ID) header of its message, when it
/// is a safe one: the bus's bytes may be anything, and a tool may print it.
pub(super) fn model_call_id(message_headers: Option<&HeaderMap>) -> Option<String> {
    let id = message_headers?.get(headers::MODEL_CALL_ID)?.as_str();
    is_valid_call_id(id).then(|| id.to_owned())
}

/// The answer to a call whose job was cancelled: stopped, or never run.
/// Nobody waits for it; it is stored so that a redelivery answers it.
fn job_cancelled() -> Envelope {
    Envelope::terminal(
        ErrorCode::CANCELLED,
        "the call's job was cancelled; the call was stopped, or not run",
    )
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_tool_gets_the_model_s_id_only_when_it_is_a_safe_one() {
        let with = |value: &str| {
            let mut message_headers = HeaderMap::new();
            message_headers.insert(headers::MODEL_CALL_ID, value);
            model_call_id(Some(&message_headers))
        };
        assert_eq!(with("call_Ab-9"), Some("call_Ab-9".to_owned()));
        assert_eq!(with("toolu_01"), Some("toolu_01".to_owned()));
        for unsafe_id in ["", "a b", "a:b", "é", &"x".repeat(65)] {
            assert_eq!(with(unsafe_id), None, "{unsafe_id:?}");
        }
        assert_eq!(model_call_id(Some(&HeaderMap::new())), None);
        assert_eq!(model_call_id(None), None, "an orchestrator before 0.2");
    }

    /// The code of an error envelope, or `"ok"`.
    fn code(envelope: &Envelope) -> String {
        envelope
            .error()
            .map_or_else(|| "ok".to_owned(), |e| e.code.to_string())
    }

    #[test]
    fn calls_that_are_not_idempotent_are_probed_before_a_redelivery_or_a_retry() {
        // (repeats_harm, previously_started, attempt, resumes, probe)
        let cases = [
            (false, false, 1, false, false),
            (false, true, 1, false, false),
            (false, false, 2, false, false),
            (true, false, 1, false, false),
            (true, true, 1, false, true),
            (true, false, 2, false, true),
            (true, true, 3, false, true),
            // Resumed from a checkpoint: the tool follows what it started.
            (true, true, 1, true, false),
            (true, true, 2, true, false),
            (false, true, 1, true, false),
        ];
        for (repeats_harm, started, attempt, resumes, expected) in cases {
            assert_eq!(
                needs_probe(repeats_harm, started, attempt, resumes),
                expected,
                "repeats_harm={repeats_harm} previously_started={started} attempt={attempt} resumes={resumes}"
            );
        }
    }

    /// What a delivery ends in: the answer's code, or `ask later`.
    fn outcome(ran: &Ran) -> String {
        match ran {
            Ran::Finished(envelope) => code(envelope),
            Ran::AskLater => "ask later".to_owned(),
            Ran::ClaimLost => "claim lost".to_owned(),
            Ran::Abandoned => "abandoned".to_owned(),
        }
    }

    /// Every error envelope that answers for a probe is terminal.
    fn assert_terminal(ran: &Ran, what: &str) {
        if let Ran::Finished(Envelope::Err(error)) = ran {
            assert!(!error.retryable, "{what}");
        }
    }

    #[test]
    fn a_poison_call_is_answered_by_what_the_probe_knows() {
        let poisoned = Envelope::terminal(ErrorCode::MAX_DELIVERIES_EXCEEDED, "not run again");
        let data = json!({"counter": 1});
        // (what the probe said, if it was asked; how the delivery ends)
        let cases = [
            (None, "MAX_DELIVERIES_EXCEEDED"),
            (Some(Applied::No), "MAX_DELIVERIES_EXCEEDED"),
            (Some(Applied::Yes(data.clone())), "ok"),
            (Some(Applied::Unknown), "OUTCOME_UNKNOWN"),
            (Some(Applied::Unavailable), "ask later"),
        ];
        for (applied, expected) in cases {
            let what = format!("{applied:?}");
            let ran = after_poison(applied, poisoned.clone());
            assert_eq!(outcome(&ran), expected, "{what}");
            assert_terminal(&ran, &what);
            if let Ran::Finished(Envelope::Ok(got)) = ran {
                assert_eq!(got, data);
            }
        }
    }

    #[test]
    fn a_probe_answers_runs_or_refuses_the_call() {
        let data = json!({"counter": 1});
        // (applied, previously_started, how the delivery ends: None runs the call)
        let cases = [
            (Applied::Yes(data.clone()), true, Some("ok")),
            (Applied::Yes(data.clone()), false, Some("ok")),
            (Applied::No, true, None),
            (Applied::No, false, None),
            (Applied::Unknown, false, None),
            (Applied::Unknown, true, Some("OUTCOME_UNKNOWN")),
            (Applied::Unavailable, true, Some("ask later")),
            (Applied::Unavailable, false, Some("ask later")),
        ];
        for (applied, started, expected) in cases {
            let what = format!("{applied:?}, previously_started={started}");
            let ran = before_run(applied, started);
            assert_eq!(ran.as_ref().map(outcome).as_deref(), expected, "{what}");
            match ran {
                Some(Ran::Finished(Envelope::Ok(got))) => assert_eq!(got, data, "{what}"),
                Some(Ran::Finished(Envelope::Err(error))) => {
                    assert!(!error.retryable, "{what}");
                    assert_eq!(error.side_effect.as_deref(), Some("unknown"), "{what}");
                }
                _ => {}
            }
        }
    }

    #[test]
    fn a_timed_out_side_effect_is_answered_by_its_probe() {
        let timed_out = Envelope::retryable(ErrorCode::TOOL_TIMEOUT, "slow");
        let cases = [
            (Applied::Yes(json!(1)), "ok", false),
            (Applied::No, "TOOL_TIMEOUT", true),
            (Applied::Unknown, "OUTCOME_UNKNOWN", false),
            (Applied::Unavailable, "ask later", false),
        ];
        for (applied, expected, retryable) in cases {
            let what = format!("{applied:?}");
            let ran = after_timeout(applied, timed_out.clone());
            assert_eq!(outcome(&ran), expected, "{what}");
            let is_retryable =
                matches!(&ran, Ran::Finished(e) if e.error().is_some_and(|e| e.retryable));
            assert_eq!(is_retryable, retryable, "{what}");
        }
    }

    #[tokio::test]
    async fn every_way_a_tool_finishes_becomes_an_envelope() {
        let panicked = tokio::spawn(async { panic!("password=hunter2") })
            .await
            .expect_err("the task panicked");
        let cases: Vec<(Finished, &str)> = vec![
            (Ok(Ok(json!({"x": 1}))), "ok"),
            (Ok(Ok(json!({"x": "a long string"}))), "PAYLOAD_TOO_LARGE"),
            (
                Ok(Err(ToolError::InvalidArguments("no".into()))),
                "INVALID_TOOL_ARGUMENTS",
            ),
            (
                Ok(Err(ToolError::Internal(anyhow::anyhow!("db.internal")))),
                "TOOL_EXECUTION_FAILED",
            ),
            (Err(panicked), "TOOL_EXECUTION_FAILED"),
        ];
        for (finished, expected) in cases {
            let what = format!("{finished:?}");
            let envelope = envelope_of(finished, 16);
            assert_eq!(code(&envelope), expected, "{what}");
            let text = envelope.to_json();
            assert!(
                !text.contains("hunter2") && !text.contains("db.internal"),
                "{what}: {text}"
            );
        }
    }
}
