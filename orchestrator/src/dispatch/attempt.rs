//! One call through its attempts: resume where a crashed runner stopped,
//! publish, wait for the envelope, and settle or retry as
//! [`retry::verdict`](super::retry::verdict) says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use futures::StreamExt;
use tokio::sync::broadcast;
use toolfleet_proto::call::is_valid_call_id;
use toolfleet_proto::envelope::{StoredResult, excerpt};
use toolfleet_proto::names::{self, headers, span_attributes};
use toolfleet_proto::{Envelope, ErrorCode, ToolCall, ToolManifest, WireId, format};
use tracing::{debug, error, info, warn};

use super::progress::ProgressGate;
use super::retry::{self, Verdict};
use super::unknown::{self, AfterVerdict};
use super::{CallOutcome, Dispatcher, Origin, PlannedCall, Ready, Round, RoundError, Waiting};
use toolfleet_service::traces::{self, StepSpan};

use crate::budget::Over;
use crate::job::{JobId, JobTrace, now_ms};
use crate::publish::{self, Refusal, Unpublished, What};
use crate::quota::{CallSlot, SlotRequest};
use crate::store::Attempts;
use crate::{spans, store};

/// An attempt's envelope, and how long it took if this runner sent it.
struct Answer {
    envelope: Envelope,
    round_trip: Option<Duration>,
    /// How long the worker worked on it, by its own clock.
    worked: Option<Duration>,
    /// The version of the tool the worker ran it on (its stored record's).
    ran_on: Option<Arc<str>>,
    /// The stored result's text when it came with the worker's reply and
    /// was not read from Redis: the commit that records it checks it there
    /// (see [`settling_record`]).
    unchecked: Option<String>,
}

/// A call's last attempt, whose envelope settles it.
struct LastAttempt {
    envelope: Envelope,
    attempt: u32,
    round_trip: Option<Duration>,
    worked: Option<Duration>,
    ran_on: Option<Arc<str>>,
    /// Where its envelope came from.
    origin: Origin,
}

/// What a settled attempt comes to ([`Dispatcher::settling`]).
enum Settling {
    /// The call's last attempt: record it.
    Last(LastAttempt),
    /// Decide again on this attempt: on what Redis holds (the answer),
    /// or, with none, on the attempt an operator said to run again.
    Again(Option<Answer>, u32),
    /// It waits for an operator's verdict.
    Wait(Waiting),
}

/// How closing a call on its last attempt ended.
enum Closed {
    /// Its outcome is final (and recorded, where this run records it).
    Settled(CallOutcome),
    /// Redis holds another result than the reply carried: decide on it.
    Reread(Answer),
}

/// How driving a call ended.
pub(super) enum Driven {
    /// It has its answer.
    Settled(CallOutcome),
    /// It waits for an operator's verdict on an unknown outcome.
    Waiting(Waiting),
}

impl Answer {
    /// `envelope`, which no worker's record came with.
    fn of(envelope: Envelope) -> Self {
        Self {
            envelope,
            round_trip: None,
            worked: None,
            ran_on: None,
            unchecked: None,
        }
    }
}

impl LastAttempt {
    /// The end of a call whose retry a budget refused (`over`), after
    /// `attempt`: its envelope says so, whatever the attempt's was.
    fn refused(
        over: &Over,
        attempt: u32,
        round_trip: Option<Duration>,
        worked: Option<Duration>,
    ) -> Self {
        Self {
            envelope: over.envelope(),
            attempt,
            round_trip,
            worked,
            ran_on: None,
            origin: Origin::Budget(over.limit()),
        }
    }

    /// The outcome of `call`, settled by this attempt.
    fn outcome(&self, call: &PlannedCall) -> CallOutcome {
        CallOutcome {
            call_id: call.call_id.clone(),
            wire_id: call.wire_id.clone(),
            event_id: call.event_id.clone(),
            name: call.name.clone(),
            output: self.envelope.to_json(),
            attempts: self.attempt,
            round_trip: self.round_trip,
            worked: self.worked,
            ran_on: self.ran_on.clone(),
            full: None,
        }
    }
}

impl Dispatcher {
    /// The call's slot in its tenant's calls in flight, waiting while the
    /// tenant is at its quota; `None` when the job has no such quota.
    async fn call_slot(
        &self,
        round: &Round<'_>,
        call: &PlannedCall,
    ) -> Result<Option<CallSlot>, RoundError> {
        let Some(limit) = round.spec.limits.max_calls_in_flight else {
            return Ok(None);
        };
        let request = SlotRequest {
            tenant: &round.spec.tenant,
            call: format!("{}/{}", round.lease.job_id, call.wire_id),
            tool: &call.name,
            limit,
            deadline_ms: round.spec.deadline_ms,
        };
        Ok(Some(self.limits.call_slot(request, round.stop).await?))
    }

    /// Drives one call through its attempts to a final envelope.
    /// `attempts` holds what earlier runners recorded (see
    /// [`resume_point`](Self::resume_point)).
    pub(super) async fn drive(
        &self,
        round: &Round<'_>,
        ready: &Ready,
        attempts: &Attempts,
    ) -> Result<Driven, RoundError> {
        let (call, policy) = (&ready.call, &ready.policy);
        let _slot = self.call_slot(round, call).await?; // held until this returns
        // Settled by an earlier runner, which recorded its event and spans:
        // its stored envelope answers it again, and nothing more is recorded.
        let settled = attempts.settled(&call.wire_id);
        let trace = if settled { None } else { round.trace };
        let mut span = spans::call(trace, call.span_ref(), self.tool_content);
        let (mut attempt, mut resumed) = self.resume_point(round, ready, attempts).await?;
        if resumed {
            span.set(span_attributes::RESUMED, true);
        }
        let mut round_trip = None;
        // What Redis holds, when a reply's copy was not what it holds.
        let mut reread = None;
        loop {
            let mut attempt_span = spans::attempt(trace, call.span_ref(), attempt, resumed);
            let answer = match reread.take() {
                Some(answer) => answer,
                None => self.answer(round, call, attempt, resumed).await?,
            };
            attempt_span.outcome(&answer.envelope);
            attempt_span.end();
            resumed = false;
            round_trip = answer.round_trip.or(round_trip);
            let code = answer.envelope.error().map(|e| e.code.to_string());
            let verdict = retry::verdict(
                answer.envelope,
                attempt,
                policy,
                self.options.max_retry_after,
                rand::random(),
            );
            let last = match verdict {
                Verdict::Settle(envelope) => {
                    let settled_by = Answer {
                        envelope,
                        round_trip,
                        ..answer
                    };
                    match self.settling(round, ready, attempt, settled_by).await? {
                        Settling::Last(last) => last,
                        Settling::Again(answer, next) => {
                            (reread, attempt) = (answer, next);
                            continue;
                        }
                        Settling::Wait(waiting) => {
                            round.results.not_coming();
                            span.end();
                            return Ok(Driven::Waiting(waiting));
                        }
                    }
                }
                Verdict::Retry(delay) => match round.budget.take_attempt(ready.cost).await? {
                    Ok(()) => {
                        attempt = self.retry(round, ready, attempt, delay, code).await?;
                        continue;
                    }
                    Err(over) => {
                        warn!(call_id = %call.wire_id, attempt, code = ?code, "{over}; not retrying");
                        LastAttempt::refused(&over, attempt, round_trip, answer.worked)
                    }
                },
            };
            let closed = self.close(round, call, last, &mut span, settled, trace);
            match closed.await? {
                Closed::Settled(outcome) => {
                    span.end();
                    return Ok(Driven::Settled(outcome));
                }
                Closed::Reread(answer) => reread = Some(answer),
            }
        }
    }

    /// Closes the call on its last attempt: its span says how it ended (the
    /// caller ends it), and its outcome is recorded, unless an earlier
    /// runner recorded it (`recorded_before`) or what Redis holds is not
    /// what the reply said, which is to be decided on again.
    async fn close(
        &self,
        round: &Round<'_>,
        call: &PlannedCall,
        last: LastAttempt,
        span: &mut StepSpan,
        recorded_before: bool,
        trace: Option<&JobTrace>,
    ) -> Result<Closed, RoundError> {
        let outcome = last.outcome(call);
        span.set(span_attributes::ATTEMPTS, i64::from(last.attempt));
        if matches!(last.origin, Origin::Operator) {
            span.set(span_attributes::OUTCOME_SOURCE, unknown::OPERATOR);
        }
        spans::settle_call(span, &last.envelope, self.tool_content);
        if !recorded_before
            && let Some(answer) = self
                .record_outcome(round, call, last, &outcome, trace)
                .await?
        {
            return Ok(Closed::Reread(answer));
        }
        Ok(Closed::Settled(outcome))
    }

    /// Waits `delay`, then records the attempt after `attempt` (retried
    /// after an envelope with `code`) and returns it.
    async fn retry(
        &self,
        round: &Round<'_>,
        ready: &Ready,
        attempt: u32,
        delay: Duration,
        code: Option<String>,
    ) -> Result<u32, RoundError> {
        let call = &ready.call;
        pause_before_retry(round, call, attempt, delay).await?;
        crate::metrics::tool_call_retried(&call.name, code.unwrap_or_default());
        let next = attempt + 1;
        self.record_dispatches(round.lease, round.trace, &[ready], next)
            .await?;
        Ok(next)
    }

    /// What `attempt` of `call`, settled with `answer`'s envelope, comes
    /// to: its last attempt, unless it is an unknown outcome an operator is
    /// asked about (`unknown`): then it waits, runs again (the attempt
    /// after it is recorded here), or settles with the operator's verdict.
    async fn settling(
        &self,
        round: &Round<'_>,
        ready: &Ready,
        attempt: u32,
        answer: Answer,
    ) -> Result<Settling, RoundError> {
        let call = &ready.call;
        let Answer {
            envelope,
            round_trip,
            ..
        } = answer;
        // An operator is asked only about what Redis holds, never about a
        // reply's copy.
        if answer.unchecked.is_some() && unknown::asks(round, &envelope) {
            let stored = self.stored_answer(round, call, attempt).await?;
            return Ok(Settling::Again(Some(stored), attempt));
        }
        let (envelope, operator) = match self.verdict_on(round, call, attempt, envelope).await? {
            AfterVerdict::Settle(envelope, operator) => (envelope, operator),
            AfterVerdict::Wait(waiting) => return Ok(Settling::Wait(waiting)),
            AfterVerdict::RunAgain => {
                // An operator's word: counted in the budget, never refused.
                let next = attempt + 1;
                self.record_dispatches(round.lease, round.trace, &[ready], next)
                    .await?;
                return Ok(Settling::Again(None, next));
            }
        };
        let origin = match answer.unchecked {
            _ if operator => Origin::Operator,
            Some(text) => Origin::Reply(text),
            None => Origin::Stored,
        };
        Ok(Settling::Last(LastAttempt {
            envelope,
            attempt,
            round_trip,
            worked: answer.worked,
            ran_on: answer.ran_on,
            origin,
        }))
    }

    /// Records a call's outcome from its last attempt. `Some`: the result
    /// a reply carried is not the one Redis holds; here is what Redis
    /// holds, to decide on again.
    async fn record_outcome(
        &self,
        round: &Round<'_>,
        call: &PlannedCall,
        last: LastAttempt,
        outcome: &CallOutcome,
        trace: Option<&JobTrace>,
    ) -> Result<Option<Answer>, RoundError> {
        let recorded = self
            .record_result(
                round.lease,
                round.results,
                trace,
                outcome,
                &last.envelope,
                last.origin,
            )
            .await;
        if let Err(RoundError::Store(store::Error::ResultMismatch(_))) = recorded {
            // Its commit (perhaps another call's, grouped with this one)
            // wrote nothing: read what Redis holds, and decide again.
            warn!(
                call_id = %call.wire_id,
                attempt = last.attempt,
                "a result that came with a reply is not the stored one (not a worker's); reading the stored one"
            );
            return Ok(Some(self.stored_answer(round, call, last.attempt).await?));
        }
        recorded?;
        Ok(None)
    }

    /// Where a call starts: `(attempt, resumed)`. In `attempts`, n > 0 resumes
    /// attempt n (it may have a result; if not it is published again, and the
    /// worker's ledger makes a second copy harmless); 0 means attempt 1 is
    /// already recorded; absent means record it now.
    async fn resume_point(
        &self,
        round: &Round<'_>,
        ready: &Ready,
        attempts: &Attempts,
    ) -> Result<(u32, bool), RoundError> {
        Ok(match attempts.last(&ready.call.wire_id) {
            Some(0) => (1, false),
            Some(n) => (n, true),
            None => {
                self.record_dispatches(round.lease, round.trace, &[ready], 1)
                    .await?;
                (1, false)
            }
        })
    }

    /// The envelope of one attempt: the stored one of a resumed attempt that
    /// has it; otherwise publish the attempt and wait for it.
    async fn answer(
        &self,
        round: &Round<'_>,
        call: &PlannedCall,
        attempt: u32,
        resumed: bool,
    ) -> Result<Answer, RoundError> {
        // Before publishing, so that no result can slip past.
        let mut notices = round.notify.subscribe();
        // Only a resumed attempt can already have a result.
        if resumed {
            let job_id = &round.lease.job_id;
            if let Some(text) = self
                .store
                .call_result(job_id, &call.name, &call.wire_id, attempt)
                .await?
            {
                return parse_stored(job_id, call, &text);
            }
        }
        // The version the attempt is pinned to, the one its model was shown.
        let pinned = self.pin(&call.name, round.offered);
        let sent = Instant::now();
        if let Some(refused) = self
            .publish(round, (call, attempt), resumed, pinned.as_deref())
            .await?
        {
            // No worker got it: the queue's refusal is its answer.
            return Ok(Answer::of(refused));
        }
        let (text, from_reply) = self.wait(round, call, attempt, &mut notices, true).await?;
        let elapsed = sent.elapsed();
        crate::metrics::tool_call_round_trip(&call.name, elapsed);
        let answer = parse_stored(&round.lease.job_id, call, &text)?;
        if let (Some(pinned), Some(ran_on)) = (&pinned, &answer.ran_on)
            && pinned != ran_on
        {
            // Workers hand back what is pinned elsewhere: this is a bug, or
            // a worker that is not what it says.
            error!(call_id = %call.wire_id, pinned = %pinned, ran_on = %excerpt(ran_on, 64),
                   "a call ran on another version of its tool than its model was shown");
        }
        Ok(Answer {
            round_trip: Some(elapsed),
            unchecked: from_reply.then_some(text),
            ..answer
        })
    }

    /// The answer of `attempt` as Redis holds it, once it holds one.
    async fn stored_answer(
        &self,
        round: &Round<'_>,
        call: &PlannedCall,
        attempt: u32,
    ) -> Result<Answer, RoundError> {
        // Before looking, so that no result can slip past.
        let mut notices = round.notify.subscribe();
        let job_id = &round.lease.job_id;
        let text = match self
            .store
            .call_result(job_id, &call.name, &call.wire_id, attempt)
            .await?
        {
            Some(text) => text,
            None => {
                self.wait(round, call, attempt, &mut notices, false)
                    .await?
                    .0
            }
        };
        parse_stored(job_id, call, &text)
    }

    /// Publishes one attempt, pinned to the version `pinned` of its tool,
    /// retrying while JetStream is unreachable or electing a leader
    /// ([`publish::acked`]). `Some`: JetStream refused it for good, and
    /// this is the attempt's answer ([`published`]).
    async fn publish(
        &self,
        round: &Round<'_>,
        (call, attempt): (&PlannedCall, u32),
        resuming: bool,
        pinned: Option<&str>,
    ) -> Result<Option<Envelope>, RoundError> {
        let Round {
            lease, spec, stop, ..
        } = round;
        let wire = wire_call(round, call, attempt);
        // A resumed attempt gets a message id of its own: JetStream's dedup
        // window must not swallow it when the first copy was consumed but its
        // result is gone. A second copy is harmless; the worker's ledger
        // answers it from the stored result.
        let msg_id = if resuming {
            format!("{}:resumed-{}", wire.msg_id(), lease.epoch)
        } else {
            wire.msg_id()
        };
        let payload: bytes::Bytes = serde_json::to_vec(&wire).expect("a call serializes").into();
        // The worker's spans are children of this attempt's.
        let trace_headers = spans::attempt_context(round.trace, &call.wire_id, attempt)
            .map(|context| traces::headers(&context))
            .unwrap_or_default();
        let headers = || {
            let mut headers = call_headers(&wire, &call.call_id, &msg_id);
            if let Some(version) = pinned {
                headers.insert(headers::TOOL_VERSION, version);
            }
            for (name, value) in &trace_headers {
                headers.insert(*name, value.as_str());
            }
            headers
        };
        // Through a stream leader's election, or an outage, until the
        // job's deadline.
        let until = tokio::time::Instant::now()
            + Duration::from_millis(spec.deadline_ms.saturating_sub(now_ms()));
        let subject = names::call_subject(&wire.tool);
        let sent = publish::acked(
            &self.js,
            What::Call,
            &subject,
            headers,
            payload,
            until,
            Some(stop),
        )
        .await;
        published(sent)
    }

    /// Tells the workers that the job of `call`'s `attempt`, in flight, was
    /// cancelled (decision 0044): a copy of the call marked
    /// `Toolfleet-Cancel`, on its subject. The worker that gets it marks the
    /// call in the ledger, where the one running it finds it at its next
    /// renewal and stops it (an MCP server's task is cancelled). For a few
    /// seconds at most: a cancel that does not get through leaves the call
    /// to run to its end, its result unread.
    async fn cancel_on_worker(&self, round: &Round<'_>, call: &PlannedCall, attempt: u32) {
        if !self
            .tell_workers(round, (call, attempt), WorkerNotice::Cancel)
            .await
        {
            warn!(call_id = %call.wire_id, "the cancel of a call in flight was not published; it runs to its end");
        }
    }

    /// Retires `call`'s `attempt` when the version of its tool that it is
    /// pinned to has had no live worker for `dispatch.version_gone_after`
    /// (decision 0058): a copy of the call marked `Toolfleet-Version-Gone`
    /// and pinned to no version, which the first worker of the tool to get
    /// it answers `TOOL_VERSION_GONE` in the ledger, unless the attempt has
    /// a result or runs already. The answer comes back as any other.
    /// Whether the notice went out (one that did not is tried again).
    async fn retire_if_gone(&self, round: &Round<'_>, call: &PlannedCall, attempt: u32) -> bool {
        let Some(version) = self.pin(&call.name, round.offered) else {
            return false;
        };
        let gone = self
            .registry
            .version_gone_for(&call.name, &version)
            .filter(|gone| *gone >= self.options.version_gone_after);
        let Some(gone) = gone else {
            return false;
        };
        info!(
            call_id = %call.wire_id,
            tool = %call.name,
            version = %version,
            gone_s = gone.as_secs(),
            "the version of the tool this call was made for has no worker; retiring the call"
        );
        let told = self
            .tell_workers(round, (call, attempt), WorkerNotice::VersionGone)
            .await;
        if told {
            crate::metrics::tool_version_gone(&call.name);
        }
        told
    }

    /// Publishes `notice` of `call`'s `attempt` to its tool's workers: a
    /// copy of the call on its subject, marked, with a message id of its
    /// own. For a few seconds at most; whether it was published.
    async fn tell_workers(
        &self,
        round: &Round<'_>,
        (call, attempt): (&PlannedCall, u32),
        notice: WorkerNotice,
    ) -> bool {
        let wire = wire_call(round, call, attempt);
        let (header, suffix) = match notice {
            WorkerNotice::Cancel => (headers::CANCEL, "cancel"),
            WorkerNotice::VersionGone => (headers::VERSION_GONE, "version-gone"),
        };
        let msg_id = format!("{}:{suffix}", wire.msg_id());
        let payload: bytes::Bytes = serde_json::to_vec(&wire).expect("a call serializes").into();
        let headers = || {
            let mut headers = call_headers(&wire, &call.call_id, &msg_id);
            headers.insert(header, "1");
            headers
        };
        let until = tokio::time::Instant::now() + NOTICE_PUBLISH;
        let subject = names::call_subject(&wire.tool);
        publish::acked(
            &self.js,
            What::Call,
            &subject,
            headers,
            payload,
            until,
            None,
        )
        .await
        .is_ok()
    }

    /// Waits for the stored result of one attempt: the one its reply
    /// carries, when `from_reply` and it settles the call (see
    /// [`settling_record`]; `true` comes back with it), else the one Redis
    /// holds once a reply or a poll finds it there.
    async fn wait(
        &self,
        round: &Round<'_>,
        call: &PlannedCall,
        attempt: u32,
        notices: &mut broadcast::Receiver<Notice>,
        from_reply: bool,
    ) -> Result<(String, bool), RoundError> {
        let Round {
            lease, spec, stop, ..
        } = round;
        // The first look at Redis is a period away: the caller just looked,
        // or just published. Not `interval`'s immediate first tick: awaiting
        // it goes through the timer wheel, which fires on the next
        // millisecond, and on a busy thread that held every result reply
        // for about a millisecond.
        let period = self.options.poll_interval;
        let mut poll = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(spec.deadline_ms.saturating_sub(now_ms()));
        let mut progress = ProgressGate::default();
        let mut retired = false;
        loop {
            // Whether to look in Redis now, and whether a reply asked to.
            let (look, replied) = tokio::select! {
                () = stop.cancelled() => {
                    if round.cancelled.is_cancelled() {
                        self.cancel_on_worker(round, call, attempt).await;
                    }
                    return Err(RoundError::Interrupted);
                }
                () = tokio::time::sleep_until(deadline) => return Err(RoundError::DeadlineExceeded),
                notice = notices.recv() => match notice {
                    Ok(notice) => {
                        let ours = notice.call_id == call.wire_id && notice.attempt == attempt;
                        if ours && notice.progress {
                            let reported = (call, attempt);
                            self.record_progress(round, reported, &notice.stored, &mut progress)
                                .await;
                            continue;
                        }
                        if ours
                            && from_reply
                            && let Some(text) = settling_record(call, &notice.stored)
                        {
                            return Ok((text, true));
                        }
                        (ours, ours)
                    }
                    // Missed notices: Redis has the answer.
                    Err(broadcast::error::RecvError::Lagged(_)) => (true, false),
                    Err(broadcast::error::RecvError::Closed) => (false, false),
                },
                _ = poll.tick() => (true, false),
            };
            if !look {
                continue;
            }
            if !replied && !retired {
                retired = self.retire_if_gone(round, call, attempt).await;
            }
            // Otherwise a reply is only a wake-up: the answer is what a
            // worker stored in Redis before it replied.
            if let Some(text) = self
                .store
                .call_result(&lease.job_id, &call.name, &call.wire_id, attempt)
                .await?
            {
                return Ok((text, false));
            }
            if replied {
                warn!(
                    call_id = %call.wire_id,
                    attempt,
                    "a reply came with no stored result (not a worker's); ignored"
                );
            }
        }
    }
}

/// Sleeps `delay` before the attempt after `attempt`, unless the job's
/// deadline would pass first or the round is stopped.
async fn pause_before_retry(
    round: &Round<'_>,
    call: &PlannedCall,
    attempt: u32,
    delay: Duration,
) -> Result<(), RoundError> {
    if now_ms().saturating_add(toolfleet_service::clock::millis(delay)) >= round.spec.deadline_ms {
        return Err(RoundError::DeadlineExceeded);
    }
    debug!(call_id = %call.wire_id, attempt, delay_ms = delay.as_millis() as u64, "retrying call");
    tokio::select! {
        () = round.stop.cancelled() => Err(RoundError::Interrupted),
        () = tokio::time::sleep(delay) => Ok(()),
    }
}

/// What a publish of an attempt comes to: `None` when it landed; the
/// attempt's answer when JetStream refused it for good (a terminal failure
/// of the call, as the orchestrator's own checks give one: too large is
/// `PAYLOAD_TOO_LARGE`, anything else `DISPATCH_REFUSED`); the round ends
/// when it was stopped (interrupted), or when an election or an outage
/// outlasted the job's deadline, the bound of its retries.
fn published(sent: Result<(), Unpublished>) -> Result<Option<Envelope>, RoundError> {
    let (code, message) = match sent {
        Ok(()) => return Ok(None),
        Err(Unpublished::Stopped) => return Err(RoundError::Interrupted),
        Err(Unpublished::Failed) => return Err(RoundError::DeadlineExceeded),
        Err(Unpublished::Refused(Refusal::TooLarge)) => (
            ErrorCode::PAYLOAD_TOO_LARGE,
            "the call's message is larger than the call queue takes; it was not run",
        ),
        Err(Unpublished::Refused(Refusal::Other)) => (
            ErrorCode::DISPATCH_REFUSED,
            "the call queue refused the call's message; it was not run",
        ),
    };
    Ok(Some(Envelope::terminal(code, message)))
}

/// The answer of the result a worker stored (its envelope, how long the
/// worker worked on it and the version of the tool it ran), if that result
/// answers this call (its tool and arguments,
/// not only its ids; see [`StoredResult`]). One that answers another call is refused with a
/// retryable `FOREIGN_RESULT`, so that the next attempt, with keys of its
/// own, runs the real call. An unreadable one (a bug or a foreign writer) is
/// the tool's failure, not the runner's.
///
/// # Errors
///
/// A record in a format this release does not read (a newer worker's,
/// decision 0059) stops the round, the record untouched, for a newer
/// orchestrator to resume the job.
fn parse_stored(job_id: &JobId, call: &PlannedCall, text: &str) -> Result<Answer, RoundError> {
    Ok(
        match StoredResult::read(text, &call.name, &call.arguments) {
            Ok(record) if let Err(unreadable) = record.format() => {
                let job_id = job_id.to_owned();
                return Err(store::Error::Unreadable { job_id, unreadable }.into());
            }
            Ok(record) if record.answers(&call.name, &call.arguments) => Answer {
                worked: record.worked_us.map(Duration::from_micros),
                // A pool writes its records: what it says goes into the job's
                // events only in the form of a contract hash.
                // (The release before read no version.)
                ran_on: record
                    .tool_version
                    .filter(|version| ToolManifest::is_contract_hash(version))
                    .filter(|_| !toolfleet_proto::release::is_previous())
                    .map(Arc::from),
                ..Answer::of(record.envelope)
            },
            Ok(record) => {
                error!(
                    call_id = %call.wire_id,
                    stored_tool = excerpt(&record.tool, 64),
                    "the stored result answers another call (a forged call with these ids?); refused"
                );
                let refused = Envelope::retryable(
                    ErrorCode::FOREIGN_RESULT,
                    "the stored result did not belong to this call; it was not used",
                );
                Answer::of(refused)
            }
            Err(err) => {
                warn!(call_id = %call.wire_id, error = %err, "a worker stored an unreadable result");
                let unreadable = Envelope::terminal(
                    ErrorCode::TOOL_EXECUTION_FAILED,
                    "the tool's answer was unreadable",
                );
                Answer::of(unreadable)
            }
        },
    )
}

/// The stored result a worker's reply carries, when the round may take it
/// without reading Redis: a record that answers `call` (its tool and
/// arguments) with a success or a terminal failure, which settles the call
/// as it is. Anyone who can publish on the bus can publish a reply, so such
/// a record is never trusted: the commit that records the call's result
/// writes nothing unless Redis holds exactly this text, and the round then
/// reads what Redis holds (`JobStore::record_call_results`). Anything else
/// (a retryable failure, which would decide a retry; a record of another
/// call; not a record) is only a wake-up, answered from Redis.
fn settling_record(call: &PlannedCall, payload: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(payload).ok()?;
    // A record, not a bare envelope (which `StoredResult::read` also takes,
    // for results stored before records had their call's name).
    let record: StoredResult = serde_json::from_str(text).ok()?;
    let settles = record.answers(&call.name, &call.arguments)
        && record.envelope.error().is_none_or(|error| !error.retryable);
    settles.then(|| text.to_owned())
}

/// A notification from the reply subject: which attempt has a result, and
/// the stored result the worker says it is; or, with `progress`, how far
/// the attempt has come ([`ProgressReport`](toolfleet_proto::ProgressReport)).
#[derive(Debug, Clone)]
pub(super) struct Notice {
    call_id: WireId,
    attempt: u32,
    stored: bytes::Bytes,
    progress: bool,
}

pub(super) async fn forward_results(
    mut subscriber: async_nats::Subscriber,
    notify: broadcast::Sender<Notice>,
) {
    while let Some(message) = subscriber.next().await {
        let Some(headers) = message.headers.as_ref() else {
            continue;
        };
        let call_id = headers
            .get(headers::CALL_ID)
            .and_then(|v| WireId::parse(v.as_str()));
        let attempt = headers
            .get(headers::ATTEMPT)
            .and_then(|v| v.as_str().parse().ok());
        let (Some(call_id), Some(attempt)) = (call_id, attempt) else {
            continue;
        };
        let progress = headers.get(headers::PROGRESS).is_some();
        // A reply in a format this release does not read is only a
        // wake-up: the round reads Redis, where the record's own format is
        // checked.
        let marker = headers.get(headers::FORMAT).map(|value| value.as_str());
        let stored = match format::read("a reply", marker) {
            Ok(_) => message.payload,
            Err(_) => bytes::Bytes::new(),
        };
        let _ = notify.send(Notice {
            call_id,
            attempt,
            stored,
            progress,
        });
    }
}

/// How long a notice to the workers of a call in flight is tried for.
const NOTICE_PUBLISH: Duration = Duration::from_secs(3);

/// What the orchestrator tells the workers of a call in flight.
#[derive(Debug, Clone, Copy)]
enum WorkerNotice {
    /// Its job was cancelled (`Toolfleet-Cancel`).
    Cancel,
    /// The version of its tool it is pinned to is gone
    /// (`Toolfleet-Version-Gone`).
    VersionGone,
}

/// The message of `call`'s `attempt` in `round`, as workers get it.
fn wire_call(round: &Round<'_>, call: &PlannedCall, attempt: u32) -> ToolCall {
    let (lease, spec) = (round.lease, round.spec);
    ToolCall {
        job_id: lease.job_id.to_string(),
        call_id: call.wire_id.to_string(),
        attempt,
        tool: call.name.clone(),
        arguments: call.arguments.clone(),
        deadline_ms: Some(spec.deadline_ms),
        idempotency_key: ToolCall::default_idempotency_key(&lease.job_id, &call.wire_id),
        reply_to: Some(names::reply_subject(&lease.job_id)),
    }
}

/// The headers of the message of `wire`, with the message id `msg_id`;
/// with the model's own id of the call, `model_id`, when it is safe in a
/// header (the model's words: anything else is left out, and the tool gets
/// none).
fn call_headers(wire: &ToolCall, model_id: &str, msg_id: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(headers::MSG_ID, msg_id);
    if let Some(format) = format::written() {
        headers.insert(headers::FORMAT, format);
    }
    headers.insert(headers::JOB_ID, wire.job_id.as_str());
    headers.insert(headers::CALL_ID, wire.call_id.as_str());
    headers.insert(headers::ATTEMPT, wire.attempt.to_string().as_str());
    headers.insert(headers::TOOL, wire.tool.as_str());
    if is_valid_call_id(model_id) {
        headers.insert(headers::MODEL_CALL_ID, model_id);
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A publish JetStream refused is the call's terminal failure, never
    /// the job's deadline; only an election or an outage that outlasted
    /// the deadline is that.
    #[test]
    fn a_record_says_the_version_it_ran_on_only_as_a_contract_hash() {
        let job_id = JobId::new("acme", 1, 2);
        let call = PlannedCall::new("call_1", "echo", "{}");
        let read = |version: &str| {
            let record = StoredResult::new(&wire_of(&call), Envelope::Ok(serde_json::json!({})))
                .ran_on(version);
            parse_stored(&job_id, &call, &record.to_json())
                .ok()
                .and_then(|answer| answer.ran_on)
                .map(|version| version.to_string())
        };
        let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        assert_eq!(read(hash).as_deref(), Some(hash));
        // What a pool wrote that is no hash never reaches the job's events.
        for forged in ["c0ffee", &"a".repeat(100_000), "../\n<script>"] {
            assert_eq!(read(forged), None);
        }
    }

    /// `call` as a worker gets it (only its tool and arguments matter here).
    fn wire_of(call: &PlannedCall) -> ToolCall {
        ToolCall {
            job_id: "acme-0000000000010000000000000002".into(),
            call_id: call.wire_id.to_string(),
            attempt: 1,
            tool: call.name.clone(),
            arguments: call.arguments.clone(),
            deadline_ms: None,
            idempotency_key: "k".into(),
            reply_to: None,
        }
    }

    #[test]
    fn a_refused_publish_fails_the_call_not_the_deadline() {
        let outcome = |sent| match published(sent) {
            Ok(None) => "published".to_owned(),
            Ok(Some(envelope)) => {
                let error = envelope.error().expect("a failure");
                assert!(!error.retryable, "{envelope:?}");
                assert!(!error.message.contains("exceeded"), "the reason is logged");
                error.code.to_string()
            }
            Err(RoundError::Interrupted) => "interrupted".to_owned(),
            Err(RoundError::DeadlineExceeded) => "deadline".to_owned(),
            Err(other) => panic!("{other}"),
        };
        let cases = [
            (Ok(()), "published"),
            (Err(Unpublished::Stopped), "interrupted"),
            (Err(Unpublished::Failed), "deadline"),
            (
                Err(Unpublished::Refused(Refusal::TooLarge)),
                "PAYLOAD_TOO_LARGE",
            ),
            (
                Err(Unpublished::Refused(Refusal::Other)),
                "DISPATCH_REFUSED",
            ),
        ];
        for (sent, expected) in cases {
            let shown = format!("{sent:?}");
            assert_eq!(outcome(sent), expected, "{shown}");
        }
    }
}
