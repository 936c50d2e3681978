//! Dispatch of one turn's tool calls: check them, publish the valid ones to
//! JetStream (at once, or one by one), gather the envelopes, retry the
//! retryable ones with backoff, and answer in the model's call order.
//!
//! A reply on the job's reply subject carries the record the worker stored
//! before it replied. The round takes it only when it settles the call, and
//! the commit that records it checks it against Redis (decision 0020); any
//! other reply only wakes the round up to read Redis, so a reply published
//! by anyone else answers nothing. Redis is polled as well, so a lost
//! notification or a takeover by another replica only costs a poll
//! interval.
//!
//! - this module: the round (checks, the calls in parallel or one by one)
//!   and the reply subscription a run keeps for its rounds ([`Replies`]);
//! - `attempt`: one call through its attempts: publish, wait, retry;
//! - `retry`: the verdict after each attempt, a pure function;
//! - `unknown`: an outcome no worker could tell, held for an operator's
//!   verdict when the job asks;
//! - `breaker`: the tools' circuit breakers: the calls they refuse before
//!   a first attempt, the tools a turn leaves out, what a settled call
//!   teaches them.
//!
//! Each call holds a slot in its tenant's calls in flight from before its
//! first attempt until it settles ([`crate::quota`]).

mod attempt;
mod breaker;
mod progress;
mod results;
mod retry;
mod unknown;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::manifest::{DEFAULT_TOOL_COST, READ_RESULT_TOOL};
use toolfleet_proto::names::{self, span_attributes};
use toolfleet_proto::{Envelope, ErrorCode, EventId, RetryPolicy, WireId, check_arguments};
use toolfleet_service::clock::millis;

use attempt::{Driven, Notice, forward_results};
pub(crate) use breaker::{Refused, Told, instructions};

use results::{GroupCommit, Settled};

use toolfleet_service::traces::StepSpan;

use crate::approval::{self, ApprovalOptions, Rule};
use crate::breaker::BreakerOptions;
use crate::budget::{self, Limit};
use crate::hold::{self, AnsweredBy, Fate, HeldFor, Hold};
use crate::job::{FullResult, JobId, JobRef, JobSpec, JobTrace, Lease, ProviderKind};
use crate::quota::{SlotError, TenantLimits};
use crate::registry::{LiveTool, RegistryHandle};
use crate::result_cache::{self, CacheEntry};
use crate::shaping::{self, ResultOptions, ResultRef, read};
use crate::spans;
use crate::spend::RunBudget;
use crate::store::{self, Approvals, Attempts, DispatchedCall, HeldCall, JobStore};

/// How the dispatcher waits and retries.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatchOptions {
    /// How often outstanding results are looked up in Redis, in case a
    /// notification was lost. Default: 1s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub poll_interval: Duration,
    /// First delay before retrying a retryable failure; doubles each time,
    /// with jitter. For tools whose manifest declares no retry policy of its
    /// own. Default: 200ms.
    #[serde(with = "toolfleet_service::config::duration")]
    pub retry_initial_backoff: Duration,
    /// Longest delay between attempts (before jitter), for tools whose
    /// manifest declares no retry policy of its own. Default: 10s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub retry_max_backoff: Duration,
    /// Largest arguments text sent to a worker, in bytes. Default: 262144.
    pub max_argument_bytes: usize,
    /// Longest wait a tool's `retry_after_ms` can ask for before a retry;
    /// a longer one is cut to it. Default: 5m.
    #[serde(with = "toolfleet_service::config::duration")]
    pub max_retry_after: Duration,
    /// How long a parallel round's settled result may wait for the round's
    /// other calls, so that they are stored (and shown to watchers) in one
    /// commit; the round's last result is stored at once. `0s` stores each
    /// result as it settles; at most [`MAX_RESULT_LINGER`]. Default: 2ms.
    #[serde(with = "result_linger")]
    pub result_linger: Duration,
    /// How long a call waits in its tool's queue while the version of the
    /// tool its model was shown has no live worker, before it is answered
    /// `TOOL_VERSION_GONE` (decision 0058). Default: 2m.
    #[serde(with = "toolfleet_service::config::duration")]
    pub version_gone_after: Duration,
}

/// The longest `dispatch.result_linger`. A result waits that long only
/// while its round still has calls out, but a call that waits for its
/// tenant's call slot held by a call of the same round makes it wait the
/// whole linger: a bound keeps that a pause, never a stall.
pub(crate) const MAX_RESULT_LINGER: Duration = Duration::from_secs(1);

/// `dispatch.result_linger`: a duration, at most [`MAX_RESULT_LINGER`].
mod result_linger {
    use std::time::Duration;

    use serde::de::Error;
    use serde::{Deserializer, Serializer};
    use toolfleet_service::config::duration;

    use super::MAX_RESULT_LINGER;

    pub(super) fn serialize<S: Serializer>(linger: &Duration, s: S) -> Result<S::Ok, S::Error> {
        duration::serialize(linger, s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let linger = duration::deserialize(d)?;
        if linger > MAX_RESULT_LINGER {
            return Err(D::Error::custom(format!(
                "{} is longer than the most a result may wait, {}",
                duration::format(linger),
                duration::format(MAX_RESULT_LINGER)
            )));
        }
        Ok(linger)
    }
}

impl Default for DispatchOptions {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            retry_initial_backoff: Duration::from_millis(200),
            retry_max_backoff: Duration::from_secs(10),
            max_argument_bytes: 256 * 1024,
            max_retry_after: Duration::from_secs(300),
            result_linger: Duration::from_millis(2),
            version_gone_after: Duration::from_secs(120),
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
pub(crate) struct PlannedCall {
    /// The model's call id: data, kept in the conversation and sent back to
    /// the model verbatim, never put on the wire.
    pub call_id: String,
    /// The id the call has on the wire and in Redis keys (NATS headers,
    /// message ids, the ledger, the attempts record): made from the job's
    /// secret and the call's position ([`WireIds`](crate::job::WireIds)).
    pub wire_id: WireId,
    /// The id the job's events show the call by ([`EventId`]).
    pub event_id: EventId,
    /// The tool name the model wrote.
    pub name: String,
    /// The arguments text as the model wrote it.
    pub arguments: String,
    /// An earlier call of the job has the same model id: this one is
    /// answered `DUPLICATE_CALL_ID` and never runs.
    pub duplicate: bool,
}

impl PlannedCall {
    /// A call whose model id is safe and new: the same id on the wire and
    /// in events (a job stored before call secrets names its calls so).
    ///
    /// # Panics
    ///
    /// If `call_id` is not a safe call id
    /// ([`is_valid_call_id`](toolfleet_proto::call::is_valid_call_id)).
    #[cfg(test)]
    pub(crate) fn new(call_id: &str, name: &str, arguments: &str) -> Self {
        let event_id = EventId::parse(call_id).expect("a safe call id names its events");
        Self {
            call_id: call_id.to_owned(),
            wire_id: event_id.clone().into(),
            event_id,
            name: name.to_owned(),
            arguments: arguments.to_owned(),
            duplicate: false,
        }
    }
}

impl PlannedCall {
    /// The call as its dispatch is recorded ([`JobStore::record_dispatch`]),
    /// each attempt costing `cost` units of the job's budget.
    /// Pinned to `version` of its tool (its contract hash), when known.
    pub(crate) fn dispatched<'a>(
        &'a self,
        cost: u64,
        version: Option<&'a str>,
    ) -> DispatchedCall<'a> {
        DispatchedCall {
            event_id: &self.event_id,
            wire_id: &self.wire_id,
            name: &self.name,
            cost,
            version,
        }
    }

    /// The call, waiting for `hold` to be decided until `expires_at_ms`.
    pub(crate) fn waiting(&self, hold: Hold, expires_at_ms: u64) -> Waiting {
        Waiting {
            hold,
            event_id: self.event_id.clone(),
            expires_at_ms,
        }
    }

    /// The call, to hold for `held_for` until `expires_at_ms`
    /// ([`JobStore::hold`]), made for `version` of its tool.
    pub(crate) fn held<'a>(
        &'a self,
        held_for: HeldFor<'a>,
        expires_at_ms: u64,
        version: Option<Arc<str>>,
    ) -> HeldCall<'a> {
        HeldCall {
            wire_id: &self.wire_id,
            held_for,
            call_id: &self.event_id,
            tool: &self.name,
            version,
            arguments: &self.arguments,
            expires_at_ms,
        }
    }

    /// What the call's spans name it by.
    pub(crate) fn span_ref(&self) -> spans::CallRef<'_> {
        spans::CallRef {
            tool: &self.name,
            wire_id: &self.wire_id,
            event_id: &self.event_id,
            call_id: &self.call_id,
            arguments: &self.arguments,
        }
    }
}

/// The answer to one call.
#[derive(Debug, Clone)]
pub(crate) struct CallOutcome {
    /// The model's call id, for the conversation.
    pub call_id: String,
    /// The call's id on the wire, for records.
    pub wire_id: WireId,
    /// The id its events show ([`PlannedCall::event_id`]).
    pub event_id: EventId,
    /// Its tool name.
    pub name: String,
    /// The envelope JSON for the model.
    pub output: String,
    /// Attempts made (0: answered without dispatch).
    pub attempts: u32,
    /// Dispatch to result of the last attempt, as this runner saw it.
    pub round_trip: Option<Duration>,
    /// How long the worker worked on the last attempt, by its own clock.
    pub worked: Option<Duration>,
    /// The version of the tool the worker ran the last attempt on (its
    /// stored record's contract hash); `None` when no worker said.
    pub ran_on: Option<Arc<str>>,
    /// The whole data when `output` is a shaped view of it, to store with
    /// the view ([`Dispatcher::shaped`]).
    pub full: Option<FullResult>,
}

/// Why a round stopped before every call had its answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RoundError {
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

impl From<SlotError> for RoundError {
    fn from(err: SlotError) -> Self {
        match err {
            SlotError::DeadlineExceeded => Self::DeadlineExceeded,
            SlotError::Interrupted => Self::Interrupted,
            SlotError::Store(err) => Self::Store(err),
        }
    }
}

/// A run's subscription to its job's reply subject, taken before its first
/// round publishes and kept for the run's later rounds: one `SUB` and
/// `UNSUB` per run, not per round. Dropped with the run (its forwarder is
/// aborted and the subscription ends), so that a run that stopped leaves no
/// subscriber on the subject.
pub(crate) struct Replies {
    /// Every reply heard, for every call of the run's rounds.
    notify: broadcast::Sender<Notice>,
    _forwarder: AbortOnDropHandle<()>,
}

/// What a round takes from the run it is part of.
#[derive(Clone, Copy)]
pub(crate) struct RunRef<'a> {
    /// The run's lease: every commit checks it.
    pub lease: &'a Lease,
    /// The run's reply subscription ([`Dispatcher::listen`]).
    pub replies: &'a Replies,
    /// Interrupts the round.
    pub stop: &'a CancellationToken,
    /// Cancelled (before `stop`) when the job's client cancelled the job:
    /// the round's calls in flight are cancelled on their workers.
    pub cancelled: &'a CancellationToken,
    /// What the job and its tenant may still spend: each call's first
    /// attempt, and each retry, takes from it.
    pub budget: &'a RunBudget,
}

/// Publishes calls and gathers their results.
#[derive(Clone)]
pub(crate) struct Dispatcher {
    pub(crate) nats: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) store: JobStore,
    pub(crate) registry: RegistryHandle,
    /// Where each call takes its slot in its tenant's calls in flight.
    pub(crate) limits: TenantLimits,
    pub(crate) options: DispatchOptions,
    /// How long a held call waits for a person's decision.
    pub(crate) approval: ApprovalOptions,
    /// Whether calls' spans carry their arguments and results
    /// (`telemetry.capture_tool_content`).
    pub(crate) tool_content: spans::ToolContent,
    /// What the model is shown of large results (`shaping`).
    pub(crate) results: ResultOptions,
    /// When a tool's breaker opens and for how long (`breaker`).
    pub(crate) breaker: BreakerOptions,
}

/// Whether a call may be published ([`Dispatcher::admit`]).
#[derive(Debug, Clone)]
pub(crate) enum Admission {
    /// It may, and is retried by this policy.
    Publish(RetryPolicy),
    /// It waits for a person's approval first: the rule that asked.
    Hold(Rule, RetryPolicy),
    /// It is answered with this envelope, never published.
    Refuse(Envelope),
    /// It is a call of the orchestrator's own tool, `read_result`,
    /// answered here and never published.
    BuiltIn,
    /// It may be answered from its tenant's result cache, at this entry;
    /// else it is published, retried by this policy, and its result cached
    /// (`result_cache`).
    LookUp(RetryPolicy, CacheEntry),
}

/// A call of the round that waits for a person's decision (an approval,
/// or a verdict on an unknown outcome): held now or before, undecided and
/// not expired.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Waiting {
    /// What it waits for: the key of its request and decision.
    pub hold: Hold,
    /// The id the job's events show it by.
    pub event_id: EventId,
    /// When it expires (Unix ms).
    pub expires_at_ms: u64,
}

/// How a round ended.
#[derive(Debug)]
pub(crate) enum RoundEnd {
    /// Every call has its answer, in the order given.
    Settled(Vec<CallOutcome>),
    /// Every call that could run has its answer (recorded, so a resumed
    /// round answers it again), and these wait for a person's decision.
    Waiting(Vec<Waiting>),
}

/// Where a call of a round goes ([`Dispatcher::place`]).
enum Placed<'c> {
    /// It runs (or resumes): checked, or approved.
    Run(Ready),
    /// It is answered without being published: a check refused it, or a
    /// person did, or nobody decided in time ([`Origin::Stored`]); or it
    /// is a call of a built-in tool, answered by the orchestrator
    /// ([`Origin::BuiltIn`]); or its tenant's result cache answered it
    /// ([`Origin::Cache`]).
    Answer(Envelope, Origin),
    /// It waits for a person's decision; with its request when it is held
    /// now.
    Wait(Waiting, Option<HeldCall<'c>>),
}

/// A checked call, ready to publish.
struct Ready {
    call: PlannedCall,
    /// How the call's retryable failures are retried.
    policy: RetryPolicy,
    /// What each attempt costs in the job's budget (its tool's `cost`).
    cost: u64,
    /// Where its result is cached once its commit found it: a call the
    /// cache was asked for and could not answer.
    cache: Option<CacheEntry>,
    /// The version of its tool it is pinned to ([`Dispatcher::shown`]).
    version: Option<Arc<str>>,
}

impl Ready {
    /// `call`, retried by `policy`, each attempt costing `cost`, its result
    /// not cached.
    fn new(call: PlannedCall, policy: RetryPolicy, cost: u64) -> Self {
        Self {
            call,
            policy,
            cost,
            cache: None,
            version: None,
        }
    }
}

/// What every call of one round shares.
struct Round<'a> {
    lease: &'a Lease,
    spec: &'a JobSpec,
    /// What the job may still spend: each retry takes its cost first.
    budget: &'a RunBudget,
    trace: Option<&'a JobTrace>,
    /// Results from the job's reply subject, for every call of the run.
    notify: &'a broadcast::Sender<Notice>,
    /// Where the round's final envelopes are recorded.
    results: &'a GroupCommit<Settled>,
    stop: &'a CancellationToken,
    /// The job was cancelled by its client ([`RunRef::cancelled`]).
    cancelled: &'a CancellationToken,
    /// The tools the job's model was shown: each call is pinned to the
    /// version of its tool the model saw ([`Dispatcher::shown`]).
    offered: &'a HashMap<String, LiveTool>,
}

impl Dispatcher {
    /// Subscribes to `job_id`'s replies, for the rounds of one run of the
    /// job (`spec`'s). Before any of them publishes, so that no result can
    /// slip past.
    ///
    /// # Errors
    ///
    /// [`RoundError::Nats`] when NATS refused the subscription.
    pub(crate) async fn listen(
        &self,
        job_id: &JobId,
        spec: &JobSpec,
    ) -> Result<Replies, RoundError> {
        // Room for every reply of a full round, four times over; a receiver
        // that lags anyway reads Redis.
        let capacity = (spec.limits.max_calls_per_turn as usize).clamp(16, 256) * 4;
        let (notify, _) = broadcast::channel(capacity);
        let subscriber = self
            .nats
            .subscribe(names::reply_subject(job_id))
            .await
            .map_err(|e| RoundError::Nats(e.to_string()))?;
        let forwarder = tokio::spawn(forward_results(subscriber, notify.clone()));
        Ok(Replies {
            notify,
            _forwarder: AbortOnDropHandle::new(forwarder),
        })
    }

    /// Runs one round of `run`: every call gets an outcome, in the order
    /// given, or waits for a person's decision. `attempts` holds the
    /// attempts already dispatched (a resumed round), `approvals` the calls
    /// held in the job and their decisions: `None` for a fresh round, none
    /// of whose calls was held yet (they are read if one needs approval).
    ///
    /// In three steps: each call is placed (`place`); the
    /// calls answered without a publish are recorded, in order, and the
    /// calls held now; then the rest are dispatched.
    ///
    /// # Errors
    ///
    /// [`RoundError`] when the round could not finish.
    pub(crate) async fn run_round(
        &self,
        run: RunRef<'_>,
        job: JobRef<'_>,
        calls: &[PlannedCall],
        attempts: &Attempts,
        offered: &HashMap<String, LiveTool>,
        mut approvals: Option<Approvals>,
    ) -> Result<RoundEnd, RoundError> {
        let (lease, spec) = (run.lease, job.spec);
        let refused = self.refused(lease, calls, attempts, offered).await;
        let mut placed = Vec::with_capacity(calls.len());
        for (index, call) in calls.iter().enumerate() {
            let place = self.place(
                run,
                job,
                (index, call),
                (attempts, &refused),
                offered,
                &mut approvals,
            );
            placed.push(place.await?);
        }
        let results = GroupCommit::new(self.options.result_linger);
        let mut outcomes: Vec<Option<CallOutcome>> = vec![None; calls.len()];
        let (mut ready, mut waiting, mut held) = (Vec::new(), Vec::new(), Vec::new());
        for (index, (call, place)) in calls.iter().zip(placed).enumerate() {
            match place {
                Placed::Run(call) => ready.push((index, call)),
                Placed::Answer(envelope, origin) => {
                    let answered =
                        self.answer_unpublished(lease, &results, job, call, &envelope, origin);
                    outcomes[index] = Some(answered.await?);
                }
                Placed::Wait(call, request) => {
                    waiting.push(call);
                    held.extend(request);
                }
            }
        }
        self.store.hold(lease, &spec.tenant, &held).await?;
        if !ready.is_empty() {
            let calls: Vec<&Ready> = ready.iter().map(|(_, r)| r).collect();
            let round = Round {
                lease,
                spec,
                budget: run.budget,
                trace: job.trace,
                notify: &run.replies.notify,
                results: &results,
                stop: run.stop,
                cancelled: run.cancelled,
                offered,
            };
            let driven = self.dispatch(&round, &calls, attempts).await?;
            for ((index, ready), driven) in ready.iter().zip(driven) {
                match driven {
                    Driven::Settled(outcome) => {
                        if let Some(entry) = &ready.cache {
                            self.cache(entry, &outcome).await;
                        }
                        outcomes[*index] = Some(outcome);
                    }
                    Driven::Waiting(call) => waiting.push(call),
                }
            }
        }
        if !waiting.is_empty() {
            return Ok(RoundEnd::Waiting(waiting));
        }
        // Every slot was filled above: answered calls directly, the rest by drive.
        let shaped = outcomes
            .into_iter()
            .flatten()
            .map(|outcome| self.shaped(outcome, job.spec, &lease.job_id, offered));
        Ok(RoundEnd::Settled(shaped.collect()))
    }

    /// `outcome` as the model is shown it: shaped when its data is over
    /// its tool's limit (the manifest's `shape_above_bytes`, live or as
    /// offered, else `results.shape_above_bytes`), never in a call job
    /// (`shaping::shape`). A `read_result` page is within the limit by
    /// construction.
    fn shaped(
        &self,
        mut outcome: CallOutcome,
        spec: &JobSpec,
        job_id: &JobId,
        offered: &HashMap<String, LiveTool>,
    ) -> CallOutcome {
        if spec.provider == ProviderKind::Call || outcome.name == READ_RESULT_TOOL {
            return outcome;
        }
        let own = self
            .registry
            .get(&outcome.name)
            .or_else(|| offered.get(&outcome.name).cloned())
            .and_then(|tool| tool.manifest.shape_above_bytes);
        let limit = shaping::limit_of(own, self.results.shape_above_bytes);
        let reference = ResultRef {
            job: job_id,
            call: &outcome.event_id,
        };
        let output = std::mem::take(&mut outcome.output);
        let shaped = shaping::shape(output, Some(limit), &reference);
        outcome.output = shaped.output;
        outcome.full = shaped.full;
        if outcome.full.is_some() {
            crate::metrics::result_shaped(&outcome.name);
        }
        outcome
    }

    /// Where the `index`-th call of a round goes. A call dispatched before
    /// (a resumed round, or recorded with its turn) runs: it passed the
    /// checks then, and what its attempt stored or answers decides its
    /// outcome, never a registry that changed since (its workers may be
    /// restarting now); an approved one with the arguments it was approved
    /// with, in every attempt. Any other call is admitted
    /// ([`admit`](Self::admit)), and one that needs approval goes where
    /// [`hold::fate`] says, the job's approvals read first if the round has
    /// not read them.
    async fn place<'c>(
        &self,
        run: RunRef<'_>,
        job: JobRef<'_>,
        (index, call): (usize, &'c PlannedCall),
        (attempts, refused): (&Attempts, &Refused),
        offered: &HashMap<String, LiveTool>,
        approvals: &mut Option<Approvals>,
    ) -> Result<Placed<'c>, RoundError> {
        let (spec, cost) = (job.spec, self.cost_of(&call.name, offered));
        if attempts.last(&call.wire_id).is_some() {
            let policy = self.retry_policy(&call.name, offered);
            let call = approvals
                .as_ref()
                .map_or_else(|| call.clone(), |approvals| as_approved(call, approvals));
            return Ok(Placed::Run(Ready::new(call, policy, cost)));
        }
        let placed = match self.admit(spec, (index, call), offered, refused) {
            Admission::Publish(policy) => Placed::Run(Ready::new(call.clone(), policy, cost)),
            Admission::LookUp(policy, entry) => self.look_up(call, policy, cost, entry).await?,
            Admission::Refuse(envelope) => Placed::Answer(envelope, Origin::Stored),
            Admission::BuiltIn => {
                let answer = self.read_result(&run.lease.job_id, call).await?;
                Placed::Answer(answer, Origin::BuiltIn)
            }
            Admission::Hold(rule, policy) => {
                let known = match approvals {
                    Some(known) => known,
                    empty => empty.insert(self.store.approvals(&run.lease.job_id).await?),
                };
                let timeout = self.approval_timeout(spec);
                let ready = Ready::new(call.clone(), policy, cost);
                let version = self.pin(&call.name, offered);
                awaiting_approval(call, ready, (rule, version), known, timeout)
            }
        };
        let placed = match placed {
            Placed::Run(ready) => Placed::Run(Ready {
                version: self.pin(&call.name, offered),
                ..ready
            }),
            other => other,
        };
        charged(placed, run.budget).await
    }

    /// How long a call of the job `spec` waits for a person: its tenant's
    /// `approval_timeout`, kept with the job, else `approval.timeout`.
    fn approval_timeout(&self, spec: &JobSpec) -> Duration {
        spec.approval
            .timeout_ms
            .map_or(self.approval.timeout, Duration::from_millis)
    }

    /// Where `call`, which its tenant's result cache may answer at `entry`,
    /// goes: answered by the cached envelope, else run and its result
    /// cached.
    async fn look_up<'c>(
        &self,
        call: &PlannedCall,
        policy: RetryPolicy,
        cost: u64,
        entry: CacheEntry,
    ) -> Result<Placed<'c>, RoundError> {
        let cached = self.store.cached_result(&entry).await?;
        if let Some(envelope) = cached.as_deref().and_then(result_cache::answer) {
            crate::metrics::result_cache(&call.name, "hit");
            return Ok(Placed::Answer(envelope, Origin::Cache));
        }
        crate::metrics::result_cache(&call.name, "miss");
        Ok(Placed::Run(Ready {
            cache: Some(entry),
            ..Ready::new(call.clone(), policy, cost)
        }))
    }

    /// Caches `outcome`, which its round's commit found, at `entry` when it
    /// is a success. A cache that cannot be written costs later calls a
    /// run, never this one its answer: the failure is logged.
    async fn cache(&self, entry: &CacheEntry, outcome: &CallOutcome) {
        let Ok(envelope) = serde_json::from_str::<Envelope>(&outcome.output) else {
            return;
        };
        let Some(text) = result_cache::to_store(&envelope) else {
            return;
        };
        match self.store.cache_result(entry, &text).await {
            Ok(()) => crate::metrics::result_cache(&outcome.name, "stored"),
            Err(err) => tracing::warn!(
                tool = %outcome.name,
                error = %err,
                "could not cache a result; later calls with the same arguments will run"
            ),
        }
    }

    /// Answers `read_result` `call` of job `job_id` from the job's shaped
    /// results (`shaping::read`).
    async fn read_result(
        &self,
        job_id: &JobId,
        call: &PlannedCall,
    ) -> Result<Envelope, RoundError> {
        let request = read::Request::parse(&call.arguments, job_id);
        // A request refused before anything is read still asks whether the
        // job holds a shaped result: a job without one knows no such tool.
        let field = request.as_ref().map_or("", |request| request.call.as_str());
        let (holds, stored) = self.store.shaped_result(job_id, field).await?;
        let budget = self.results.shape_above_bytes;
        Ok(read::answer(holds, request, stored.as_deref(), budget))
    }

    /// Answers `call` with `envelope` without publishing it (a check
    /// refused it, or a person did, or it is a built-in tool's, as
    /// `origin` says), and records the answer.
    async fn answer_unpublished(
        &self,
        lease: &Lease,
        results: &GroupCommit<Settled>,
        job: JobRef<'_>,
        call: &PlannedCall,
        envelope: &Envelope,
        origin: Origin,
    ) -> Result<CallOutcome, RoundError> {
        // Answered here: a call span with no attempt.
        let mut span = spans::call(job.trace, call.span_ref(), self.tool_content);
        span.set(span_attributes::ATTEMPTS, 0_i64);
        if let Some(source) = origin.source() {
            span.set(span_attributes::OUTCOME_SOURCE, source);
        }
        spans::settle_call(&mut span, envelope, self.tool_content);
        let outcome = CallOutcome {
            call_id: call.call_id.clone(),
            wire_id: call.wire_id.clone(),
            event_id: call.event_id.clone(),
            name: call.name.clone(),
            output: envelope.to_json(),
            attempts: 0,
            round_trip: None,
            worked: None,
            ran_on: None,
            full: None,
        };
        self.record_result(lease, results, job.trace, &outcome, envelope, origin)
            .await?;
        span.end();
        Ok(outcome)
    }

    /// Sends the checked calls of a round (at once, or one by one) and
    /// gathers their outcomes in the same order.
    async fn dispatch(
        &self,
        round: &Round<'_>,
        calls: &[&Ready],
        attempts: &Attempts,
    ) -> Result<Vec<Driven>, RoundError> {
        let Round {
            lease,
            spec,
            trace,
            results,
            ..
        } = round;
        if !spec.parallel_tool_calls {
            let mut done = Vec::new();
            for ready in calls {
                done.push(self.drive(round, ready, attempts).await?);
            }
            return Ok(done);
        }
        // One commit records the first attempt of every fresh call.
        let fresh: Vec<&Ready> = calls
            .iter()
            .copied()
            .filter(|r| attempts.last(&r.call.wire_id).is_none())
            .collect();
        self.record_dispatches(lease, *trace, &fresh, 1).await?;
        // Their results are worth grouping: all but those an earlier runner
        // settled, which are answered without being recorded again.
        results.expect(
            calls
                .iter()
                .filter(|r| !attempts.settled(&r.call.wire_id))
                .count(),
        );
        let mut recorded = attempts.clone();
        for ready in fresh {
            recorded.record(ready.call.wire_id.clone(), 0);
        }
        let runs = calls.iter().map(|r| self.drive(round, r, &recorded));
        futures::future::join_all(runs).await.into_iter().collect()
    }

    /// Whether the `index`-th call of a turn may be published, and then its
    /// retry policy; whether it needs a person's approval first; else the
    /// envelope that answers it: the orchestrator's own checks (see
    /// [`check`](Self::check)), the job's calls-per-turn limit and the
    /// tool's breaker (`refused`, [`gate_calls`](Self::gate_calls)). A call
    /// that fails the checks is answered at once, without asking anyone; a
    /// call its breaker refused is never held nor answered from the cache.
    /// A runner asks before it records a fresh round's first attempts with
    /// the turn; the round asks again for any call it finds unrecorded.
    pub(crate) fn admit(
        &self,
        spec: &JobSpec,
        (index, call): (usize, &PlannedCall),
        offered: &HashMap<String, LiveTool>,
        refused: &Refused,
    ) -> Admission {
        if index >= spec.limits.max_calls_per_turn as usize {
            return Admission::Refuse(Envelope::terminal(
                ErrorCode::TOO_MANY_CALLS,
                format!(
                    "the model made more than {} calls in one turn; this one was not run. \
                     Make fewer calls per turn",
                    spec.limits.max_calls_per_turn
                ),
            ));
        }
        // The orchestrator's own, never published nor held: it reads only
        // the job's own results (a duplicate id is refused as any call's).
        if call.name == READ_RESULT_TOOL && !call.duplicate {
            return Admission::BuiltIn;
        }
        match self.check(spec, call, offered) {
            Err(envelope) => Admission::Refuse(envelope),
            Ok(tool) => {
                if let Some(envelope) = refused.envelope(call) {
                    return Admission::Refuse(envelope);
                }
                let manifest = &tool.manifest;
                let policy = manifest.retry_policy(self.options.default_retry_policy());
                // Approval first: a held call is never answered from the cache.
                match approval::needs_approval(manifest, &spec.approval) {
                    Some(rule) => Admission::Hold(rule, policy),
                    None => match result_cache::entry(spec, manifest, &call.arguments) {
                        Some(entry) => Admission::LookUp(policy, entry),
                        None => Admission::Publish(policy),
                    },
                }
            }
        }
    }

    /// What an attempt of a call of `tool` costs in the job's budget: its
    /// live manifest's `cost`, else the one the job was offered, else 1.
    pub(crate) fn cost_of(&self, tool: &str, offered: &HashMap<String, LiveTool>) -> u64 {
        self.registry
            .get(tool)
            .or_else(|| offered.get(tool).cloned())
            .map_or(DEFAULT_TOOL_COST, |live| live.manifest.cost_units())
    }

    /// The retry policy of `tool`: its live manifest's, else the one the
    /// job was offered, else the defaults.
    fn retry_policy(&self, tool: &str, offered: &HashMap<String, LiveTool>) -> RetryPolicy {
        let default = self.options.default_retry_policy();
        self.registry
            .get(tool)
            .or_else(|| offered.get(tool).cloned())
            .map_or(default, |live| live.manifest.retry_policy(default))
    }

    /// The orchestrator's own checks; a failure is the call's envelope. A
    /// tool the job was offered whose workers are gone for now passes: its
    /// call waits in the stream for them, within the job's deadline.
    fn check(
        &self,
        spec: &JobSpec,
        call: &PlannedCall,
        offered: &HashMap<String, LiveTool>,
    ) -> Result<LiveTool, Envelope> {
        if call.duplicate {
            return Err(Envelope::terminal(
                ErrorCode::DUPLICATE_CALL_ID,
                format!(
                    "an earlier call of this job has the id {:?}; this one was not run. \
                     Give every call its own id",
                    excerpt(&call.call_id, 64)
                ),
            ));
        }
        let allowed = spec.tools.is_empty() || spec.tools.contains(&call.name);
        let Some(tool) = self.shown(&call.name, offered).filter(|_| allowed) else {
            return Err(Envelope::terminal(
                ErrorCode::UNKNOWN_TOOL,
                format!(
                    "no tool named {:?} is available to this job",
                    excerpt(&call.name, 64)
                ),
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

    /// The version of `tool` the job's model was shown: the one `offered`
    /// to it (kept with the job, so a resumed run pins the same), else, for
    /// a tool it was never offered, the live one. A call is checked against
    /// this version's schema and runs only on workers that announce it
    /// (decision 0058).
    pub(crate) fn shown(
        &self,
        tool: &str,
        offered: &HashMap<String, LiveTool>,
    ) -> Option<LiveTool> {
        offered
            .get(tool)
            .cloned()
            .or_else(|| self.registry.get(tool))
    }

    /// The version of `tool` that a call of a job `offered` it is pinned to:
    /// the one its model was shown ([`shown`](Self::shown)); none from a
    /// process that plays the release before, which did not pin.
    pub(crate) fn pin(&self, tool: &str, offered: &HashMap<String, LiveTool>) -> Option<Arc<str>> {
        if toolfleet_proto::release::is_previous() {
            return None;
        }
        self.shown(tool, offered).map(|tool| tool.contract)
    }

    /// Records that `attempt` of each of `calls` is about to be published.
    async fn record_dispatches(
        &self,
        lease: &Lease,
        trace: Option<&JobTrace>,
        calls: &[&Ready],
        attempt: u32,
    ) -> Result<(), RoundError> {
        // One commit for the round: its span goes under the first attempt.
        let commit = calls.first().map_or_else(StepSpan::off, |ready| {
            let step = spans::Step::Attempt(&ready.call.wire_id, attempt);
            spans::commit(trace, step, "record_dispatch")
        });
        let calls: Vec<DispatchedCall<'_>> = calls
            .iter()
            .map(|ready| ready.call.dispatched(ready.cost, ready.version.as_deref()))
            .collect();
        self.store.record_dispatch(lease, &calls, attempt).await?;
        commit.end();
        Ok(())
    }

    /// Records a call's final envelope, in a commit it may share with the
    /// round's other calls ([`GroupCommit`]).
    async fn record_result(
        &self,
        lease: &Lease,
        results: &GroupCommit<Settled>,
        trace: Option<&JobTrace>,
        outcome: &CallOutcome,
        envelope: &Envelope,
        origin: Origin,
    ) -> Result<(), RoundError> {
        let source = origin.source();
        let budget_exceeded = match origin {
            Origin::Budget(limit) => limit,
            _ => None,
        };
        // Only a call that ran tells its tool's breaker anything.
        let ran = outcome.attempts > 0 && matches!(origin, Origin::Reply(_) | Origin::Stored);
        let unchecked = match origin {
            Origin::Reply(text) => Some(text),
            _ => None,
        };
        let step = spans::Step::Call(&outcome.wire_id);
        let commit = spans::commit(trace, step, "record_call_result");
        let settled = Settled {
            event_id: outcome.event_id.clone(),
            wire_id: outcome.wire_id.clone(),
            name: outcome.name.clone(),
            attempts: outcome.attempts,
            round_trip: outcome.round_trip,
            worked: outcome.worked,
            ran_on: outcome.ran_on.clone(),
            envelope: envelope.clone(),
            source,
            unchecked,
            budget_exceeded,
        };
        results
            .record(settled, |batch| async move {
                let calls: Vec<_> = batch.iter().map(Settled::as_call).collect();
                self.store.record_call_results(lease, &calls).await
            })
            .await?;
        commit.end();
        crate::metrics::tool_call_settled(&outcome.name, envelope);
        if ran {
            let call = (outcome.name.as_str(), &outcome.wire_id);
            self.learn(&lease.job_id, call, envelope).await;
        }
        Ok(())
    }
}

/// Where a settled envelope came from, as the commit that records it must
/// know.
pub(crate) enum Origin {
    /// Read from Redis, or made by the orchestrator's own checks.
    Stored,
    /// The stored result's text as the worker's reply carried it: the
    /// commit checks it against Redis ([`store::SettledCall::unchecked`]).
    Reply(String),
    /// An operator's verdict on an unknown outcome (`dispatch::unknown`).
    Operator,
    /// The orchestrator's own answer to a built-in tool (`read_result`).
    BuiltIn,
    /// A result of an earlier call, from the tenant's result cache
    /// (`result_cache`).
    Cache,
    /// The job's budget (its limit kept with the call's result) or its
    /// tenant's refused the call's first attempt, or its next one
    /// (`crate::budget`).
    Budget(Option<Limit>),
}

impl Origin {
    /// What the call's `tool_call_result` event and span say produced the
    /// envelope, when no worker did.
    fn source(&self) -> Option<&'static str> {
        match self {
            Self::Stored | Self::Reply(_) => None,
            Self::Operator => Some(unknown::OPERATOR),
            Self::BuiltIn => Some(read::BUILT_IN),
            Self::Cache => Some(result_cache::CACHE),
            Self::Budget(_) => Some(budget::BUDGET),
        }
    }
}

/// `placed` once the budgets are asked: a call about to get its first
/// attempt takes one call and its cost, or is answered `BUDGET_EXCEEDED`
/// without running (and so is every call after it).
async fn charged<'c>(placed: Placed<'c>, budget: &RunBudget) -> Result<Placed<'c>, RoundError> {
    Ok(match placed {
        Placed::Run(ready) => match budget.take_call(ready.cost).await? {
            Ok(()) => Placed::Run(ready),
            Err(over) => Placed::Answer(over.envelope(), Origin::Budget(over.limit())),
        },
        other => other,
    })
}

/// `call` as it runs: with the arguments a person approved it with, if
/// they gave some; the model's own call item is never changed.
fn as_approved(call: &PlannedCall, approvals: &Approvals) -> PlannedCall {
    let mut call = call.clone();
    if let Some(arguments) = approvals
        .decisions
        .get(&Hold::approval(&call.wire_id))
        .and_then(|decision| decision.arguments.clone())
    {
        call.arguments = arguments;
    }
    call
}

/// Where `call`, which needs approval by `rule`, goes: what [`hold::fate`]
/// says of its hold in `approvals`, now. `ready` is the call as it runs if
/// it was approved, with the approver's arguments put in.
fn awaiting_approval<'c>(
    call: &'c PlannedCall,
    mut ready: Ready,
    (rule, version): (Rule, Option<Arc<str>>),
    approvals: &Approvals,
    timeout: Duration,
) -> Placed<'c> {
    let held_for = HeldFor::Approval(rule);
    let hold = held_for.hold(&call.wire_id);
    let expires_at_ms = approvals.requests.get(&hold).map(|r| r.expires_at_ms);
    let decision = approvals.decisions.get(&hold);
    match hold::fate(
        held_for,
        decision,
        expires_at_ms,
        crate::job::now_ms(),
        timeout,
    ) {
        Fate::Run { arguments } => {
            if let Some(arguments) = arguments {
                ready.call.arguments = arguments;
            }
            Placed::Run(ready)
        }
        Fate::Answer { envelope, by } => {
            if by == AnsweredBy::Expiry {
                crate::metrics::approval_decided(&call.name, "expired", None);
            }
            Placed::Answer(envelope, Origin::Stored)
        }
        Fate::Hold { until_ms } => {
            crate::metrics::approval_requested(&call.name, held_for.rule());
            let request = call.held(held_for, until_ms, version);
            Placed::Wait(call.waiting(hold, until_ms), Some(request))
        }
        Fate::Wait { until_ms } => Placed::Wait(call.waiting(hold, until_ms), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OrchestratorOptions;

    #[test]
    fn a_result_lingers_at_most_a_second_and_start_up_says_so() {
        let load = |linger: &str| {
            let overrides = serde_json::json!({"dispatch": {"result_linger": linger}});
            OrchestratorOptions::load(None, overrides)
        };
        for (text, linger) in [("0s", Duration::ZERO), ("1s", MAX_RESULT_LINGER)] {
            let options = load(text).expect("a linger within the bound loads");
            assert_eq!(options.dispatch.result_linger, linger);
        }
        let error = load("1s1ms").expect_err("longer than a second").to_string();
        assert!(error.contains("result_linger"), "{error}");
        assert!(error.contains("1s1ms is longer than"), "{error}");
    }
}
