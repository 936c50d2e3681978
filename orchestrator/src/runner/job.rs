//! One job's model loop, resumable at every step from what Redis holds. The
//! decisions are [`step::next_step`](super::step::next_step); this file does
//! the work they name and keeps the job alive while it runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use tokio_util::sync::CancellationToken;
use toolfleet_service::traces::StepSpan;
use tracing::{Instrument, info, info_span, warn};

use super::Runner;
use super::step::{self, RunState, Step, StopReason};
use crate::budget::{JobBudget, Spend};
use crate::dispatch::{PlannedCall, Replies, RoundEnd, RoundError, RunRef, Waiting};
use crate::job::{
    Ending, FullResult, Item, JobEvent, JobRecord, JobRef, Lease, ToolManifest, TurnCheckpoint,
    now_ms,
};
use crate::model::{ModelError, Usage};
use crate::registry::LiveTool;
use crate::spans;
use crate::spend::RunBudget;
use crate::store::{self, Attempts, Parked, RunStart, Unstored};

mod deltas;
mod turn;

use turn::TurnOf;

/// Why a job stopped without ending.
#[derive(Debug)]
pub(super) enum Stopped {
    /// Shutdown: hand the job to another replica.
    HandedBack,
    /// Parked until a person decides a held call: no runner holds it, and
    /// its message is done (a decision queues it again).
    Parked,
    /// Another runner took the job over.
    LeaseLost,
    /// Redis failed; retry later.
    Store(store::Error),
}

impl From<store::Error> for Stopped {
    fn from(err: store::Error) -> Self {
        match err {
            store::Error::LeaseLost(_) => Self::LeaseLost,
            other => Self::Store(other),
        }
    }
}

/// The run's stop signal: a token that ends every wait, and the reason of
/// whoever cancelled it first. A cancelled parent (the drain ran out) counts
/// as [`StopReason::Shutdown`].
#[derive(Clone)]
struct StopSignal {
    token: CancellationToken,
    reason: Arc<OnceLock<StopReason>>,
    /// Cancelled, before `token`, when the first reason is the client's
    /// cancel: the calls in flight are then cancelled on their workers.
    cancelled: CancellationToken,
}

impl StopSignal {
    fn child_of(parent: &CancellationToken) -> Self {
        Self {
            token: parent.child_token(),
            reason: Arc::default(),
            cancelled: CancellationToken::new(),
        }
    }

    fn stop(&self, reason: StopReason) {
        if self.reason.set(reason).is_ok() && reason == StopReason::CancelRequested {
            self.cancelled.cancel();
        }
        self.token.cancel();
    }

    fn reason(&self) -> Option<StopReason> {
        self.token
            .is_cancelled()
            .then(|| self.reason.get().copied().unwrap_or(StopReason::Shutdown))
    }
}

/// The conversation and counters of a run, as far as it got.
struct Progress {
    items: Vec<Item>,
    /// How many of `items` are stored. The rest are the results of the last
    /// round, which are stored with the next commit (the next turn's, or the
    /// end's), and the turn that ended the job.
    stored: usize,
    /// The whole data of the shaped results among the unstored items,
    /// stored in the same commit as they are.
    full: Vec<FullResult>,
    /// Whether the job holds a shaped result (stored, or about to be with
    /// the next commit): its model is offered `read_result`.
    shaped: bool,
    /// The turn that ended the job, stored with the end.
    last_turn: Option<LastTurn>,
    turns: u32,
    rounds: u32,
    cancel_requested: bool,
    /// The tools the model was offered in this job, as offered. A call to one
    /// of them waits for its workers if they are gone for a moment (a NATS
    /// outage, a restart) instead of being unknown.
    offered: HashMap<String, LiveTool>,
    /// The attempts of a round whose turn this run just recorded, with the
    /// first attempt of each call it admitted (0: recorded, not yet
    /// published; see `Dispatcher::run_round`): none was dispatched before
    /// (their wire ids are new), so the round needs no look at the attempts
    /// recorded in Redis.
    fresh_round: Option<Attempts>,
}

/// A turn that ended the job, not stored yet: its items are `items[start..]`
/// of the run's [`Progress`].
struct LastTurn {
    start: usize,
    turns: u32,
    rounds: u32,
    offered: Vec<ToolManifest>,
    usage: Option<Usage>,
    /// The tokens it counts against the job's budget.
    tokens: u64,
    /// The span of its checkpoint: the commit that ends the job.
    commit: StepSpan,
}

/// How a run ends the job: the ending, and what the run did that is not
/// stored yet, to store with it in one commit.
struct End {
    ending: Ending,
    /// The items after the stored ones.
    unstored: Vec<Item>,
    /// The whole data of the shaped results among them.
    full: Vec<FullResult>,
    /// The turn that ended the job; its items are `unstored[start..]`.
    last_turn: Option<LastTurn>,
    /// What the job spent, for its final event.
    spent: Spend,
}

impl End {
    /// An end before anything was done.
    fn at_once(ending: Ending, spent: Spend) -> Self {
        Self {
            ending,
            unstored: Vec::new(),
            full: Vec::new(),
            last_turn: None,
            spent,
        }
    }

    fn unstored(&self) -> Unstored<'_> {
        match &self.last_turn {
            Some(turn) => {
                let (results, items) = self.unstored.split_at(turn.start.min(self.unstored.len()));
                Unstored::Turn(TurnCheckpoint {
                    results,
                    full: &self.full,
                    items,
                    turns: turn.turns,
                    rounds: turn.rounds,
                    offered: &turn.offered,
                    usage: turn.usage,
                    tokens: turn.tokens,
                })
            }
            None if self.unstored.is_empty() => Unstored::Nothing,
            None => Unstored::Results {
                items: &self.unstored,
                full: &self.full,
            },
        }
    }
}

impl Progress {
    /// Where a run of the job `record` starts: its stored conversation
    /// `items`, and the tools it `offered` the model so far.
    fn resumed(record: &JobRecord, items: Vec<Item>, offered: Vec<ToolManifest>) -> Self {
        Self {
            stored: items.len(),
            items,
            full: Vec::new(),
            shaped: record.shaped,
            last_turn: None,
            turns: record.turns,
            rounds: record.rounds,
            cancel_requested: record.cancel_requested,
            offered: offered
                .into_iter()
                .filter_map(LiveTool::known)
                .map(|tool| (tool.manifest.name.clone(), tool))
                .collect(),
            fresh_round: None,
        }
    }

    /// The run ends the job with `ending`, having spent `spent`.
    fn end(mut self, ending: Ending, spent: Spend) -> End {
        let unstored = self.items.split_off(self.stored);
        let last_turn = self.last_turn.map(|turn| LastTurn {
            start: turn.start - self.stored,
            ..turn
        });
        End {
            ending,
            unstored,
            full: self.full,
            last_turn,
            spent,
        }
    }
}

pub(super) struct JobRun<'a> {
    pub(super) runner: &'a Runner,
    pub(super) lease: Lease,
    pub(super) message: &'a jetstream::Message,
    /// When the job was submitted (Unix ms), once the run has read it.
    pub(super) created_at_ms: AtomicU64,
    /// When the runner asked for the lease, which started the run.
    pub(super) taken_at: std::time::SystemTime,
    /// The job's replies, from the run's first round on.
    pub(super) replies: tokio::sync::OnceCell<Replies>,
}

impl JobRun<'_> {
    /// Runs the job to its end, unless stopped; `start` is what the run
    /// starts from, when the lease's round trip read it.
    pub(super) async fn drive(
        self,
        abandon: CancellationToken,
        start: Option<RunStart>,
    ) -> Result<(), Stopped> {
        let span = info_span!(
            "job",
            job_id = %self.lease.job_id,
            epoch = self.lease.epoch,
            trace_id = tracing::field::Empty
        );
        async move {
            let stop = StopSignal::child_of(&abandon);
            let run = async {
                let result = self.run(&stop, start).await;
                // Ends keep_alive, unless it stopped the run itself.
                stop.token.cancel();
                result
            };
            let (result, ()) = tokio::join!(run, self.keep_alive(&stop));
            match (result, stop.reason.get()) {
                // Whatever the run made of it, another runner owns the job now.
                (_, Some(StopReason::LeaseLost)) => Err(Stopped::LeaseLost),
                (Ok(None), _) => Ok(()),
                (Ok(Some(end)), _) => self.finish(end).await,
                (Err(stopped), _) => Err(stopped),
            }
        }
        .instrument(span)
        .await
    }

    /// Keeps the job message and the lease alive, and watches for a cancel
    /// request, until the run stops.
    async fn keep_alive(&self, stop: &StopSignal) {
        let options = &self.runner.options;
        // The first ticks come one period from now, not at once: the lease
        // and the message were just taken, and the run reads the cancel flag
        // with the job.
        let every = |period: Duration| {
            tokio::time::interval_at(tokio::time::Instant::now() + period, period)
        };
        let mut renew = every(options.job_ack_wait.min(options.lease_ttl) / 3);
        let mut poll = every(options.cancel_poll_interval);
        loop {
            tokio::select! {
                () = stop.token.cancelled() => return,
                _ = renew.tick() => {
                    if let Err(err) = self.message.ack_with(AckKind::Progress).await {
                        warn!(error = %err, "could not keep the job message alive");
                    }
                    match self.runner.store.renew(&self.lease, options.lease_ttl).await {
                        Ok(()) => {}
                        Err(store::Error::LeaseLost(_)) => {
                            warn!("lease lost: another runner took the job over; stopping");
                            return stop.stop(StopReason::LeaseLost);
                        }
                        Err(err) => warn!(error = %err, "could not renew the lease"),
                    }
                }
                _ = poll.tick() => {
                    if let Ok(true) = self.runner.store.cancel_requested(&self.lease.job_id).await {
                        return stop.stop(StopReason::CancelRequested);
                    }
                }
            }
        }
    }

    /// The loop: does what [`step::next_step`] says until the job ends or the
    /// run stops. `Ok(None)`: the job had already ended.
    async fn run(
        &self,
        stop: &StopSignal,
        start: Option<RunStart>,
    ) -> Result<Option<End>, Stopped> {
        let start = match start {
            Some(start) => Some(start),
            None => self.runner.store.load_run(&self.lease.job_id).await?,
        };
        let Some(RunStart {
            record,
            offered,
            items,
        }) = start
        else {
            return Ok(None);
        };
        if record.status.is_final() {
            return Ok(None);
        }
        self.started(&record);
        let spec = &record.spec;
        let provider = match self.runner.providers.for_job(spec) {
            Ok(provider) => provider,
            Err(err) => return Ok(Some(End::at_once(model_failure(&err), record.spent))),
        };
        let progress = Progress::resumed(&record, items, offered);
        let budget = RunBudget::new(
            JobBudget::resumed(spec.budget, record.spent, record.budget_exceeded),
            &spec.tenant,
            spec.limits.tenant_budget,
            self.runner.store.clone(),
        );
        let run = self
            .run_loop(&record, &*provider, progress, &budget, stop)
            .await;
        // What the run spent is its tenant's, however it stopped.
        budget.flush().await;
        run
    }

    /// The loop of [`run`](Self::run), over the job `record` played by
    /// `provider`, from `progress`, within `budget`.
    async fn run_loop(
        &self,
        record: &JobRecord,
        provider: &dyn crate::model::Provider,
        mut progress: Progress,
        budget: &RunBudget,
        stop: &StopSignal,
    ) -> Result<Option<End>, Stopped> {
        let (spec, trace) = (&record.spec, record.trace.as_ref());
        loop {
            let over_budget = budget.over();
            let state = RunState {
                spec,
                rounds: progress.rounds,
                cancel_requested: progress.cancel_requested,
                stop: stop.reason(),
                now_ms: now_ms(),
                wire_ids: &record.wire_ids,
                over_budget: over_budget.as_ref(),
            };
            let job = JobRef { spec, trace };
            let ending = match step::next_step(&progress.items, state) {
                Step::Finish(ending) => {
                    if let Some(over) = &over_budget
                        && ending == crate::spend::ending(over)
                    {
                        crate::metrics::budget_exceeded(&spec.tenant, over.field());
                    }
                    Some(ending)
                }
                Step::Stop(_) => return Err(Stopped::HandedBack),
                Step::Dispatch(calls) => {
                    self.dispatch(job, budget, &calls, &mut progress, stop)
                        .await?
                }
                // The tenant's period budgets are asked before each turn.
                Step::PlayTurn => match budget.before_turn().await? {
                    Some(over) => {
                        crate::metrics::budget_exceeded(&spec.tenant, over.field());
                        Some(crate::spend::ending(&over))
                    }
                    None => {
                        let turn = TurnOf {
                            job,
                            budget,
                            wire_ids: &record.wire_ids,
                            provider,
                        };
                        self.play_turn(turn, &mut progress, stop).await?
                    }
                },
            };
            if let Some(ending) = ending {
                return Ok(Some(progress.end(ending, budget.spent())));
            }
        }
    }

    /// Says that the run started (in the log, the metrics and the job's
    /// trace), and notes when the job was submitted.
    fn started(&self, record: &JobRecord) {
        let trace = record.trace.as_ref();
        if let Some(trace) = trace {
            tracing::Span::current().record("trace_id", trace.trace_id());
        }
        self.created_at_ms
            .store(record.created_at_ms, Ordering::Relaxed);
        // Taking the lease started the run.
        let (lease, owner) = (&self.lease, &self.runner.owner);
        if lease.resumed {
            crate::metrics::job_resumed();
        }
        let mut started = spans::run(trace, &lease.job_id, lease.epoch, owner, lease.resumed);
        started.started_at(self.taken_at);
        started.end();
        // The kind alone: an event without its owner allocates nothing.
        let event = JobEvent::run_started(lease.epoch, String::new(), lease.resumed);
        info!(kind = event.kind(), "job running");
    }

    /// Runs one round of calls; returns the job's ending if the round ends
    /// it. Each result is recorded as it settles; the result items join the
    /// conversation here and are stored with the run's next commit. An
    /// interrupted round returns `None`: the next step sees why.
    async fn dispatch(
        &self,
        job: JobRef<'_>,
        budget: &RunBudget,
        calls: &[PlannedCall],
        progress: &mut Progress,
        stop: &StopSignal,
    ) -> Result<Option<Ending>, Stopped> {
        let store = &self.runner.store;
        // Only the first try of a fresh round: one that failed part way
        // (NATS) may have recorded attempts, or held calls. A fresh round's
        // calls were never held: the round reads approvals only if one is.
        let (attempts, approvals) = match progress.fresh_round.take() {
            Some(recorded) => (recorded, None),
            None => {
                let job_id = &self.lease.job_id;
                (
                    store.attempts(job_id).await?,
                    Some(store.approvals(job_id).await?),
                )
            }
        };
        let dispatcher = &self.runner.dispatcher;
        let replies = self
            .replies
            .get_or_try_init(|| dispatcher.listen(&self.lease.job_id, job.spec))
            .await;
        let round = match replies {
            Ok(replies) => {
                let run = RunRef {
                    lease: &self.lease,
                    replies,
                    stop: &stop.token,
                    cancelled: &stop.cancelled,
                    budget,
                };
                dispatcher
                    .run_round(run, job, calls, &attempts, &progress.offered, approvals)
                    .await
            }
            Err(err) => Err(err),
        };
        let outcomes = match round {
            Ok(RoundEnd::Settled(outcomes)) => outcomes,
            Ok(RoundEnd::Waiting(waiting)) => return self.park(&waiting).await,
            Err(RoundError::Interrupted) => return Ok(None),
            // The deadline passed, or is too close for the retry a call needed.
            Err(RoundError::DeadlineExceeded) => return Ok(Some(step::deadline_exceeded())),
            Err(RoundError::Store(err)) => return Err(err.into()),
            Err(RoundError::Nats(err)) => {
                warn!(error = %err, "nats unavailable during the round; retrying");
                tokio::select! {
                    () = stop.token.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
                return Ok(None);
            }
        };
        for outcome in outcomes {
            if let Some(full) = outcome.full {
                progress.full.push(full);
                progress.shaped = true;
            }
            progress.items.push(Item::ToolResult {
                call_id: outcome.call_id,
                name: outcome.name,
                output: outcome.output,
                attempts: outcome.attempts,
            });
        }
        Ok(None)
    }

    /// Parks the job until a person decides one of the `waiting` calls, or
    /// the first of them expires; unless all were decided meanwhile, when
    /// the run goes on (`Ok(None)`: the next step dispatches them).
    async fn park(&self, waiting: &[Waiting]) -> Result<Option<Ending>, Stopped> {
        let fields: Vec<String> = waiting.iter().map(|call| call.hold.field()).collect();
        let calls: Vec<(&str, &str)> = fields
            .iter()
            .zip(waiting)
            .map(|(field, call)| (field.as_str(), call.event_id.as_str()))
            .collect();
        let wake_at = waiting
            .iter()
            .map(|call| call.expires_at_ms)
            .min()
            .unwrap_or(0);
        match self.runner.store.park(&self.lease, &calls, wake_at).await? {
            Parked::Decided => Ok(None),
            Parked::CancelRequested => Ok(Some(Ending::Cancelled)),
            Parked::Parked => {
                info!(calls = waiting.len(), "job parked: waiting for approval");
                Err(Stopped::Parked)
            }
        }
    }

    async fn finish(&self, end: End) -> Result<(), Stopped> {
        let ending = &end.ending;
        self.runner
            .store
            .finish(&self.lease, ending, end.unstored(), Some(end.spent))
            .await?;
        if let Some(turn) = end.last_turn {
            turn.commit.end();
        }
        let kind = ending.event(None).kind();
        info!(kind, "job finished");
        let created = self.created_at_ms.load(Ordering::Relaxed);
        let took = (created > 0).then(|| Duration::from_millis(now_ms().saturating_sub(created)));
        crate::metrics::job_finished(kind, took);
        Ok(())
    }
}

fn model_failure(err: &ModelError) -> Ending {
    Ending::failed(err.code(), err.to_string())
}
