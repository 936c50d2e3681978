//! Dispatch of one turn's tool calls: check them, publish the valid ones to
//! JetStream (at once, or one by one), gather the envelopes, retry the
//! retryable ones with backoff, and answer in the model's call order.
//!
//! Results arrive on the job's reply subject; Redis, where the worker stored
//! the envelope before publishing it, is the source of truth and is polled as
//! well, so a lost notification or a takeover by another replica only costs a
//! poll interval.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream;
use backon::{BackoffBuilder, ExponentialBuilder};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use toolfleet_proto::names::{self, headers};
use toolfleet_proto::{Envelope, ErrorBody, ErrorCode, RetryPolicy, ToolCall, check_arguments};
use toolfleet_service::clock::millis;
use tracing::{debug, warn};

use crate::job::{JobSpec, Lease, now_ms};
use crate::registry::{LiveTool, RegistryHandle};
use crate::store::{self, JobStore, SettledCall};

/// How the dispatcher waits and retries.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatchOptions {
    /// How often outstanding results are looked up in Redis, in case a
    /// notification was lost. Default: 1s.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// First delay before retrying a retryable failure; doubles each time,
    /// with jitter. For tools whose manifest declares no retry policy of its
    /// own. Default: 200ms.
    #[serde(with = "humantime_serde")]
    pub retry_initial_backoff: Duration,
    /// Longest delay between attempts (before jitter), for tools whose
    /// manifest declares no retry policy of its own. Default: 10s.
    #[serde(with = "humantime_serde")]
    pub retry_max_backoff: Duration,
    /// Largest arguments text sent to a worker, in bytes. Default: 262144.
    pub max_argument_bytes: usize,
}

impl Default for DispatchOptions {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            retry_initial_backoff: Duration::from_millis(200),
            retry_max_backoff: Duration::from_secs(10),
            max_argument_bytes: 256 * 1024,
        }
    }
}

impl DispatchOptions {
    /// The retry policy of tools that declare none: exponential from
    /// `retry_initial_backoff` to `retry_max_backoff`, doubling, with up to
    /// as much again at random; the attempt limit is the manifest's.
    pub fn default_retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            initial_backoff_ms: millis(self.retry_initial_backoff),
            max_backoff_ms: millis(self.retry_max_backoff),
            multiplier: 2.0,
            jitter: 1.0,
            max_attempts: 3,
        }
    }
}

/// One call of a turn, as the model made it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedCall {
    /// The model's call id.
    pub call_id: String,
    /// The tool name the model wrote.
    pub name: String,
    /// The arguments text as the model wrote it.
    pub arguments: String,
}

/// The answer to one call.
#[derive(Debug, Clone)]
pub struct CallOutcome {
    /// The call.
    pub call_id: String,
    /// Its tool name.
    pub name: String,
    /// The envelope JSON for the model.
    pub output: String,
    /// Attempts made (0: answered without dispatch).
    pub attempts: u32,
    /// Dispatch to result of the last attempt, as this runner saw it.
    pub round_trip: Option<Duration>,
}

/// Why a round stopped before every call had its answer.
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    /// The job was cancelled, its lease lost, or the process is shutting down.
    #[error("the round was interrupted")]
    Interrupted,
    /// The job's deadline passed.
    #[error("the job's deadline passed during the round")]
    DeadlineExceeded,
    /// The job store failed.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// NATS refused the result subscription; the round can be retried.
    #[error("nats unavailable: {0}")]
    Nats(String),
}

/// Publishes calls and gathers their results.
#[derive(Clone)]
pub struct Dispatcher {
    pub(crate) nats: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) store: JobStore,
    pub(crate) registry: RegistryHandle,
    pub(crate) options: DispatchOptions,
}

/// A checked call, ready to publish.
struct Ready {
    call: PlannedCall,
    tool: LiveTool,
}

impl Dispatcher {
    /// Runs one round: every call gets an outcome, in the order given.
    /// `attempts` holds the attempts already dispatched (a resumed round).
    /// `stop` interrupts the round.
    ///
    /// # Errors
    ///
    /// [`RoundError`] when the round could not finish.
    pub async fn run_round(
        &self,
        lease: &Lease,
        spec: &JobSpec,
        calls: &[PlannedCall],
        attempts: &HashMap<String, u32>,
        stop: &CancellationToken,
    ) -> Result<Vec<CallOutcome>, RoundError> {
        let mut outcomes: Vec<Option<CallOutcome>> = vec![None; calls.len()];
        let mut ready = Vec::new();
        for (index, call) in calls.iter().enumerate() {
            match self.check(spec, call) {
                Ok(tool) => ready.push((
                    index,
                    Ready {
                        call: call.clone(),
                        tool,
                    },
                )),
                Err(envelope) => {
                    let outcome = CallOutcome {
                        call_id: call.call_id.clone(),
                        name: call.name.clone(),
                        output: envelope.to_json(),
                        attempts: 0,
                        round_trip: None,
                    };
                    self.record_result(lease, &outcome, &envelope).await?;
                    outcomes[index] = Some(outcome);
                }
            }
        }
        if !ready.is_empty() {
            // Subscribe before publishing, so no result can slip past.
            let (notify, _) = broadcast::channel(calls.len().max(16) * 4);
            let subscriber = self
                .nats
                .subscribe(names::reply_subject(&lease.job_id))
                .await
                .map_err(|e| RoundError::Nats(e.to_string()))?;
            // Aborted (and its subscription dropped) however the round ends:
            // an interrupted or failed round must not leave a subscriber
            // behind on the job's reply subject.
            let _forwarder =
                AbortOnDropHandle::new(tokio::spawn(forward_results(subscriber, notify.clone())));
            let result = if spec.parallel_tool_calls {
                // One commit records the first attempt of every fresh call.
                let fresh: Vec<&PlannedCall> = ready
                    .iter()
                    .map(|(_, r)| &r.call)
                    .filter(|c| !attempts.contains_key(&c.call_id))
                    .collect();
                self.record_dispatches(lease, &fresh, 1).await?;
                let mut recorded = attempts.clone();
                for call in fresh {
                    recorded.insert(call.call_id.clone(), 0);
                }
                let recorded = &recorded;
                let runs = ready
                    .iter()
                    .map(|(_, r)| self.drive(lease, spec, r, recorded, &notify, stop));
                futures::future::join_all(runs)
                    .await
                    .into_iter()
                    .collect::<Result<Vec<_>, _>>()
            } else {
                let mut done = Vec::new();
                for (_, r) in &ready {
                    done.push(self.drive(lease, spec, r, attempts, &notify, stop).await?);
                }
                Ok(done)
            };
            for ((index, _), outcome) in ready.iter().zip(result?) {
                outcomes[*index] = Some(outcome);
            }
        }
        // Every slot was filled above: checked calls directly, the rest by drive.
        Ok(outcomes.into_iter().flatten().collect())
    }

    /// The orchestrator's own checks; a failure is the call's envelope.
    fn check(&self, spec: &JobSpec, call: &PlannedCall) -> Result<LiveTool, Envelope> {
        let allowed = spec.tools.is_empty() || spec.tools.contains(&call.name);
        let Some(tool) = self.registry.get(&call.name).filter(|_| allowed) else {
            return Err(Envelope::terminal(
                ErrorCode::UNKNOWN_TOOL,
                format!("no tool named {:?} is available to this job", call.name),
            ));
        };
        if call.arguments.len() > self.options.max_argument_bytes {
            return Err(Envelope::terminal(
                ErrorCode::PAYLOAD_TOO_LARGE,
                format!(
                    "arguments are {} bytes; the limit is {}",
                    call.arguments.len(),
                    self.options.max_argument_bytes
                ),
            ));
        }
        check_arguments(&call.name, &tool.validator, &call.arguments)?;
        Ok(tool)
    }

    /// Drives one call through its attempts to a final envelope.
    async fn drive(
        &self,
        lease: &Lease,
        spec: &JobSpec,
        ready: &Ready,
        attempts: &HashMap<String, u32>,
        notify: &broadcast::Sender<Notice>,
        stop: &CancellationToken,
    ) -> Result<CallOutcome, RoundError> {
        let call = &ready.call;
        let policy = ready
            .tool
            .manifest
            .retry_policy(self.options.default_retry_policy());
        // In `attempts`: n > 0 resumes attempt n (it may have a result; if not
        // it is published again, and the worker's ledger makes a second copy
        // harmless); 0 means attempt 1 is already recorded; absent means
        // record it now.
        let (mut attempt, mut resumed) = match attempts.get(&call.call_id) {
            Some(0) => (1, false),
            Some(n) => (*n, true),
            None => {
                self.record_dispatches(lease, &[call], 1).await?;
                (1, false)
            }
        };
        let mut round_trip = None;
        loop {
            let mut notices = notify.subscribe();
            // Only a resumed attempt can already have a result.
            let resuming = resumed;
            let stored = if resumed {
                resumed = false;
                self.store
                    .call_result(&lease.job_id, &call.call_id, attempt)
                    .await?
            } else {
                None
            };
            let text = match stored {
                Some(text) => text,
                None => {
                    let sent = std::time::Instant::now();
                    self.publish(lease, spec, call, attempt, resuming, stop)
                        .await?;
                    let text = self
                        .wait(lease, spec, call, attempt, &mut notices, stop)
                        .await?;
                    let elapsed = sent.elapsed();
                    crate::metrics::tool_call_round_trip(&call.name, elapsed);
                    round_trip = Some(elapsed);
                    text
                }
            };
            let envelope: Envelope = serde_json::from_str(&text).unwrap_or_else(|err| {
                warn!(call_id = %call.call_id, error = %err, "a worker stored an unreadable envelope");
                Envelope::terminal(ErrorCode::TOOL_EXECUTION_FAILED, "the tool's answer was unreadable")
            });
            let retry = match envelope.error() {
                Some(ErrorBody {
                    retryable: true,
                    retry_after_ms,
                    ..
                }) => policy.next_delay(
                    attempt,
                    retry_after_ms.map(Duration::from_millis),
                    rand::random(),
                ),
                _ => None,
            };
            let Some(delay) = retry else {
                let envelope = match envelope.error() {
                    Some(error) if error.retryable => Envelope::terminal(
                        ErrorCode::MAX_ATTEMPTS_EXCEEDED,
                        format!(
                            "gave up after {attempt} attempts; the last failed with {}: {}",
                            error.code, error.message
                        ),
                    ),
                    _ => envelope,
                };
                let outcome = CallOutcome {
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    output: envelope.to_json(),
                    attempts: attempt,
                    round_trip,
                };
                self.record_result(lease, &outcome, &envelope).await?;
                return Ok(outcome);
            };
            if now_ms().saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
                >= spec.deadline_ms
            {
                return Err(RoundError::DeadlineExceeded);
            }
            debug!(call_id = %call.call_id, attempt, delay_ms = delay.as_millis() as u64, "retrying call");
            tokio::select! {
                () = stop.cancelled() => return Err(RoundError::Interrupted),
                () = tokio::time::sleep(delay) => {}
            }
            attempt += 1;
            crate::metrics::tool_call_retried(&call.name);
            self.record_dispatches(lease, &[call], attempt).await?;
        }
    }

    /// Records that `attempt` of each of `calls` is about to be published.
    async fn record_dispatches(
        &self,
        lease: &Lease,
        calls: &[&PlannedCall],
        attempt: u32,
    ) -> Result<(), RoundError> {
        let calls: Vec<(&str, &str)> = calls
            .iter()
            .map(|call| (call.call_id.as_str(), call.name.as_str()))
            .collect();
        self.store.record_dispatch(lease, &calls, attempt).await?;
        Ok(())
    }

    async fn record_result(
        &self,
        lease: &Lease,
        outcome: &CallOutcome,
        envelope: &Envelope,
    ) -> Result<(), RoundError> {
        let settled = SettledCall {
            call_id: &outcome.call_id,
            name: &outcome.name,
            attempts: outcome.attempts,
            round_trip: outcome.round_trip,
            envelope,
        };
        self.store.record_call_result(lease, &settled).await?;
        Ok(())
    }

    /// Publishes one attempt, retrying while JetStream is unreachable.
    async fn publish(
        &self,
        lease: &Lease,
        spec: &JobSpec,
        call: &PlannedCall,
        attempt: u32,
        resuming: bool,
        stop: &CancellationToken,
    ) -> Result<(), RoundError> {
        // A resumed attempt gets a message id of its own: JetStream's dedup
        // window must not swallow it when the first copy was consumed but its
        // result is gone. A second copy is harmless; the worker's ledger
        // answers it from the stored result.
        let msg_id = |wire: &ToolCall| {
            if resuming {
                format!("{}:resumed-{}", wire.msg_id(), lease.epoch)
            } else {
                wire.msg_id()
            }
        };
        let wire = ToolCall {
            job_id: lease.job_id.clone(),
            call_id: call.call_id.clone(),
            attempt,
            tool: call.name.clone(),
            arguments: call.arguments.clone(),
            deadline_ms: Some(spec.deadline_ms),
            idempotency_key: ToolCall::default_idempotency_key(&lease.job_id, &call.call_id),
            reply_to: Some(names::reply_subject(&lease.job_id)),
        };
        let payload: bytes::Bytes = serde_json::to_vec(&wire).expect("a call serializes").into();
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_secs(2))
            .with_jitter()
            .without_max_times()
            .build();
        loop {
            let mut headers = HeaderMap::new();
            headers.insert(headers::MSG_ID, msg_id(&wire).as_str());
            headers.insert(headers::JOB_ID, wire.job_id.as_str());
            headers.insert(headers::CALL_ID, wire.call_id.as_str());
            headers.insert(headers::ATTEMPT, attempt.to_string().as_str());
            headers.insert(headers::TOOL, wire.tool.as_str());
            let sent = self
                .js
                .publish_with_headers(names::call_subject(&wire.tool), headers, payload.clone())
                .await;
            let acked = match sent {
                Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                Err(err) => Err(err.to_string()),
            };
            match acked {
                Ok(()) => return Ok(()),
                Err(err) => {
                    warn!(call_id = %call.call_id, error = %err, "publishing the call failed; retrying")
                }
            }
            if now_ms() >= spec.deadline_ms {
                return Err(RoundError::DeadlineExceeded);
            }
            let delay = delays.next().unwrap_or(Duration::from_secs(2));
            tokio::select! {
                () = stop.cancelled() => return Err(RoundError::Interrupted),
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Waits for the envelope of one attempt: a notification, or Redis.
    async fn wait(
        &self,
        lease: &Lease,
        spec: &JobSpec,
        call: &PlannedCall,
        attempt: u32,
        notices: &mut broadcast::Receiver<Notice>,
        stop: &CancellationToken,
    ) -> Result<String, RoundError> {
        let mut poll = tokio::time::interval(self.options.poll_interval);
        poll.tick().await; // the first tick is immediate; the caller just looked
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(spec.deadline_ms.saturating_sub(now_ms()));
        loop {
            tokio::select! {
                () = stop.cancelled() => return Err(RoundError::Interrupted),
                () = tokio::time::sleep_until(deadline) => return Err(RoundError::DeadlineExceeded),
                notice = notices.recv() => match notice {
                    Ok(notice) if notice.call_id == call.call_id && notice.attempt == attempt => {
                        return Ok(notice.body);
                    }
                    Ok(_) => {}
                    // Missed notices: Redis has the answer.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if let Some(text) = self.store.call_result(&lease.job_id, &call.call_id, attempt).await? {
                            return Ok(text);
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => {}
                },
                _ = poll.tick() => {
                    if let Some(text) = self.store.call_result(&lease.job_id, &call.call_id, attempt).await? {
                        return Ok(text);
                    }
                }
            }
        }
    }
}

/// A result notification from the reply subject.
#[derive(Debug, Clone)]
struct Notice {
    call_id: String,
    attempt: u32,
    body: String,
}

async fn forward_results(
    mut subscriber: async_nats::Subscriber,
    notify: broadcast::Sender<Notice>,
) {
    while let Some(message) = subscriber.next().await {
        let Some(headers) = message.headers.as_ref() else {
            continue;
        };
        let call_id = headers.get(headers::CALL_ID).map(|v| v.as_str().to_owned());
        let attempt = headers
            .get(headers::ATTEMPT)
            .and_then(|v| v.as_str().parse().ok());
        let (Some(call_id), Some(attempt)) = (call_id, attempt) else {
            continue;
        };
        let body = String::from_utf8_lossy(&message.payload).into_owned();
        let _ = notify.send(Notice {
            call_id,
            attempt,
            body,
        });
    }
}
